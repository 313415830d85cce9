"""What the report says with a handful of seeds: the interval a verdict was decided on, P(>) intervals that
do not claim certainty, and rows whose baseline has no values.

The runs are hand-made frames with the columns :func:`lossscale_bench.report.summarize` reads (the store's
own columns are tested in test_report.py); numbers are worked out by hand beside each test.
"""

from __future__ import annotations

import io
import math

import pandas as pd
import pytest

from lossscale_bench.report import compare_rows, render, summarize


def _runs(rows: dict[str, dict[int, object]], baseline: str) -> pd.DataFrame:
    """One run per (label, seed): a float is a finished value (mAP fraction), a string a status."""
    out = []
    for n, (label, by_seed) in enumerate(rows.items()):
        for seed, v in by_seed.items():
            value = v if isinstance(v, float) else math.nan
            out.append(
                {
                    "study": "s",
                    "model": "ssd_tiny",
                    "batch_size": 4,
                    "row": n,
                    "label": label,
                    "precision": "fp32",
                    "seed": seed,
                    "eval_metric": "coco",
                    "baseline": label == baseline,
                    "status": "finished" if isinstance(v, float) else v,
                    "final_map": value,
                }
            )
    return pd.DataFrame(out)


def _row(summary: pd.DataFrame, label: str):
    return summary[summary["label"] == label].iloc[0]


def _vs(md: str, label: str) -> str:
    return next(x for x in md.splitlines() if x.startswith(f"| SSD-tiny | {label} ")).strip("|").split("|")[-1].strip()


# Two seeds; per-seed differences from the baseline 0.1 and 0.3 points: mean 0.2, sd 0.1414, se 0.1.
# t = 2 on 1 df: p = 0.295, no difference. 90% interval 0.2 ± t(0.95, 1) · 0.1 = 0.2 ± 0.6314 =
# [-0.43, +0.83], inside ±1.0: TOST says equivalent; the 95% interval 0.2 ± 12.706 · 0.1 = [-1.07, +1.47]
# crosses ±1.0, and printed beside "equivalent" it read as a contradiction.
TWO_SEEDS = {"base": {0: 0.400, 1: 0.420}, "close": {0: 0.401, 1: 0.423}}


def test_equivalent_cell_shows_the_interval_tost_decided_on():
    runs = _runs(TWO_SEEDS, "base")
    r = _row(summarize(runs), "close")
    assert r["outcome"] == "equivalent"
    assert (100 * r["diff_ci_low"], 100 * r["diff_ci_high"]) == (
        pytest.approx(-1.0706, abs=1e-3),
        pytest.approx(1.4706, abs=1e-3),
    )
    assert (100 * r["tost_ci_low"], 100 * r["tost_ci_high"]) == (
        pytest.approx(-0.4314, abs=1e-3),
        pytest.approx(0.8314, abs=1e-3),
    )
    cell = _vs(render(runs, "markdown"), "close")
    assert cell.startswith("equivalent (±1.0, paired TOST p=")
    assert ", Δ +0.20, 90% CI [-0.43, +0.83], " in cell and "[-1.07, +1.47]" not in cell
    # 2 wins in 2: P(>) = 1 with the exact interval [√0.025, 1] = [0.16, 1.00]
    assert cell.endswith("P(>)=1.00 [0.16, 1.00]")
    # --compare words the pair the same way
    pairs, _ = compare_rows(summarize(runs, values=True))
    assert pairs.iloc[0]["outcome"] == "equivalent"
    cmp = render_compare_markdown(runs)
    line = next(x for x in cmp.splitlines() if x.startswith("| base "))
    assert "-0.20, 90% CI [-0.83, +0.43]" in line and "[-1.47, +1.07]" not in line


def render_compare_markdown(runs: pd.DataFrame) -> str:
    from lossscale_bench.report.renderers import render_compare

    return render_compare(summarize(runs, values=True), "markdown", "final_map", 1.0)


def test_p_better_from_three_seeds_is_never_a_zero_width_interval():
    # worse on every one of 3 seeds: 0 wins in 3, Clopper-Pearson [0, 0.708] (the bootstrap said [0, 0]); no two
    # differences tied (two of three equal is the most skewed three values can be: Shapiro-Wilk flags it)
    runs = _runs(
        {
            "base": {0: 0.50, 1: 0.51, 2: 0.49},
            "bad": {0: 0.10, 1: 0.12, 2: 0.11},
            "good": {0: 0.521, 1: 0.535, 2: 0.52},
        },
        "base",
    )
    s = summarize(runs)
    bad, good = _row(s, "bad"), _row(s, "good")
    assert (bad["p_better"], bad["p_better_low"]) == (0.0, 0.0)
    assert bad["p_better_high"] == pytest.approx(0.7076, abs=1e-4)
    assert (good["p_better"], good["p_better_high"]) == (1.0, 1.0)
    assert good["p_better_low"] == pytest.approx(0.2924, abs=1e-4)
    md = render(runs, "markdown")
    assert _vs(md, "bad").endswith("P(>)=0.00 [0.00, 0.71]")
    assert _vs(md, "good").endswith("P(>)=1.00 [0.29, 1.00]")
    assert "[0.00, 0.00]" not in md and "[1.00, 1.00]" not in md
    assert "Clopper–Pearson" in md and "bootstrap" not in md
    # --compare: no pair of the three claims certainty either
    pairs, _ = compare_rows(summarize(runs, values=True))
    assert (pairs["p_better_high"] - pairs["p_better_low"]).min() == pytest.approx(1 - 0.2924, abs=1e-4)
    cmp = render_compare_markdown(runs)
    assert "[0.00, 0.00]" not in cmp and "[1.00, 1.00]" not in cmp and "bootstrap" not in cmp
    assert "Clopper–Pearson" in cmp and "better/worse: Holm p < 0.05." in cmp


def test_unpaired_p_better_has_no_interval():
    # the row ran seeds 3, 4, 5, the baseline 0, 1, 2: Welch, and P(>) = U/(n·m) = 0 without an interval
    runs = _runs({"base": {0: 0.50, 1: 0.51, 2: 0.49}, "other": {3: 0.10, 4: 0.12, 5: 0.11}}, "base")
    r = _row(summarize(runs), "other")
    assert r["test"] == "welch" and r["p_better"] == 0.0
    assert math.isnan(r["p_better_low"]) and math.isnan(r["p_better_high"])
    assert _vs(render(runs, "markdown"), "other").endswith("P(>)=0.00")


def test_a_baseline_without_values_says_so_in_every_row():
    # seeds 0, 1; the baseline diverged on both: the other rows have two values each, and every one of them used
    # to read "too few seeds", blaming their own seeds
    runs = _runs({"base": {0: "diverged", 1: "diverged"}, "a": {0: 0.40, 1: 0.42}, "b": {0: 0.41, 1: 0.43}}, "base")
    s = summarize(runs)
    for label in ("a", "b"):
        r = _row(s, label)
        assert r["verdict"] == "baseline has no values (2 diverged, 0 failed)"
        assert r["outcome"] == "no baseline values" and math.isnan(r["p_value"])
    assert _row(s, "base")["verdict"] == "baseline"
    md = render(runs, "markdown")
    assert _vs(md, "a") == _vs(md, "b") == "baseline has no values (2 diverged, 0 failed)"
    assert "too few seeds" not in _vs(md, "a") and (s["test"] == "").all()
    # failed on every seed, and one failed, one still running: the counts say which
    runs = _runs({"base": {0: "failed", 1: "failed"}, "a": {0: 0.40, 1: 0.42}}, "base")
    assert _row(summarize(runs), "a")["verdict"] == "baseline has no values (0 diverged, 2 failed)"
    runs = _runs({"base": {0: "failed", 1: "running"}, "a": {0: 0.40, 1: 0.42}}, "base")
    assert _row(summarize(runs), "a")["verdict"] == "baseline has no values (0 diverged, 1 failed, 1 running)"


def test_a_row_no_test_ran_on_names_no_test():
    # one seed a side: too few seeds for any test; the csv's test column said "welch"
    runs = _runs({"base": {0: 0.50}, "one": {0: 0.40}, "none": {0: "failed"}, "flat": {0: 0.45}}, "base")
    s = summarize(runs)
    assert _row(s, "one")["verdict"] == "too few seeds" and _row(s, "one")["test"] == ""
    assert _row(s, "none")["verdict"] == "no values" and _row(s, "none")["test"] == ""
    back = pd.read_csv(io.StringIO(render(runs, "csv")))
    assert back["test"].isna().all()
    # no spread on either side: no t statistic, no test named either
    runs = _runs({"base": {0: 0.50, 1: 0.50}, "flat": {2: 0.45, 3: 0.45}}, "base")
    flat = _row(summarize(runs), "flat")
    assert flat["verdict"] == "no seed variance" and flat["test"] == ""
    # where a test ran, it is named
    runs = _runs({"base": {0: 0.50, 1: 0.51}, "two": {0: 0.40, 1: 0.42}, "other": {2: 0.40, 3: 0.43}}, "base")
    s = summarize(runs)
    assert (_row(s, "two")["test"], _row(s, "other")["test"]) == ("paired", "welch")


@pytest.mark.parametrize(
    "rows",
    [
        {"base": {0: "diverged", 1: "diverged"}, "a": {0: 0.40, 1: 0.42}},  # the baseline diverged everywhere
        {"base": {0: "running", 1: "running"}, "a": {0: "running", 1: "running"}},  # before any value exists
    ],
)
def test_the_verdict_note_names_the_study_margin_when_no_row_has_a_test(rows):
    # no row has a test, so no row carried the margin, and the note named the default ±1.0 for a study at 0.5
    md = render(_runs(rows, "base"), "markdown", margin=0.5)
    note = next(x for x in md.splitlines() if x.startswith("vs baseline:"))
    assert "inside ±0.5 mAP" in note and "equivalence_margin: 0.5" in note and "±1.0" not in note


def test_a_row_that_diverged_on_some_seeds_is_never_equivalent():
    # within ±0.1 points of the baseline on the three seeds it finished, diverged on the fourth: the TOST on
    # the values (Welch: the seeds differ) said "equivalent", as if the diverged seed had not happened
    runs = _runs(
        {"base": {0: 0.400, 1: 0.401, 2: 0.402, 3: 0.4015}, "row": {0: 0.4005, 1: 0.4012, 2: 0.4019, 3: "diverged"}},
        "base",
    )
    r = _row(summarize(runs), "row")
    assert r["outcome"] == "diverged" and r["test"] == "welch"
    assert r["verdict"].startswith("diverged on 1 of 4 seeds (never equivalent); the other seeds: equivalent (±1.0")
    assert "diverged on 1 of 4 seeds (never equivalent)" in _vs(render(runs, "markdown"), "row")


def test_a_row_with_skewed_differences_is_flagged_and_needs_the_rank_test():
    from scipy import stats

    # seven seeds a little better than the baseline, one far worse: the t-test sees no difference, and the
    # differences are skewed (one long tail), which Shapiro-Wilk flags; the rank test is the second opinion
    base = [0.40, 0.42, 0.41, 0.43, 0.39, 0.405, 0.415, 0.425]
    offsets = [0.002, 0.003, 0.0025, 0.0035, 0.0028, 0.0022, 0.0031, -0.06]
    runs = _runs(
        {"base": dict(enumerate(base)), "row": {k: b + o for k, (b, o) in enumerate(zip(base, offsets))}}, "base"
    )
    r = _row(summarize(runs), "row")
    d = [(b + o) - b for b, o in zip(base, offsets)]
    assert stats.shapiro(d).pvalue < 0.05 and r["shapiro_p"] == pytest.approx(stats.shapiro(d).pvalue, rel=1e-6)
    assert r["wilcoxon_p"] == pytest.approx(stats.wilcoxon(d).pvalue, rel=1e-6)
    assert "skewed or heavy-tailed differences (Shapiro–Wilk p" in r["verdict"]
    assert "Wilcoxon signed-rank p=" in r["verdict"] and r["outcome"] == "inconclusive"
    assert "skewed or heavy-tailed differences" in _vs(render(runs, "markdown"), "row")
    # normal-looking differences: no flag, the t-test's verdict alone (and the rank numbers in the csv)
    runs = _runs({"base": {0: 0.40, 1: 0.42, 2: 0.41}, "ok": {0: 0.401, 1: 0.4225, 2: 0.4118}}, "base")
    ok = _row(summarize(runs), "ok")
    assert "skewed" not in ok["verdict"] and not math.isnan(ok["shapiro_p"]) and ok["shapiro_p"] >= 0.05
