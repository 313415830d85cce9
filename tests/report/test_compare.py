"""report/compare.py and ``lsbench report --compare``: every pair of rows, Holm, the ranking's letters.

The pairwise numbers are checked against scipy's t-tests and Holm's procedure written out by hand; the
CLI tests run the real ``lsbench report`` on a real SQLite MLflow store filled the way the trial code
fills it (no training: test_report._add_trial writes the runs).
"""

from __future__ import annotations

import io
import math

import pandas as pd
import pytest
from test_report import _add_trial
from test_stats import ADAPTIVE, FP32, X128

from helpers import lsbench
from lossscale_bench.report import ReportError, compare_rows, letter_groups, render_compare, summarize, write_report


def _runs(rows: dict[str, dict[int, float] | str], study: str = "s", bs: int = 8) -> pd.DataFrame:
    """A hand-made runs frame: label -> seed -> value (row order as given; the first is fp32), or 'diverged'."""
    out = []
    for row, (label, values) in enumerate(rows.items()):
        prec = "fp32" if row == 0 else "fp8-e4m3-emulated"
        if values == "diverged":
            out += [
                dict(
                    study=study,
                    trial_id=f"{label}-{s}",
                    model="ssd_tiny",
                    batch_size=bs,
                    row=row,
                    label=label,
                    precision=prec,
                    seed=s,
                    status="diverged",
                    final_map=math.nan,
                    eval_metric="coco",
                )
                for s in range(3)
            ]
            continue
        out += [
            dict(
                study=study,
                trial_id=f"{label}-{s}",
                model="ssd_tiny",
                batch_size=bs,
                row=row,
                label=label,
                precision=prec,
                seed=s,
                status="finished",
                final_map=v,
                eval_metric="coco",
            )
            for s, v in values.items()
        ]
    return pd.DataFrame(out)


def _pairs(rows, margin=1.0):
    return compare_rows(summarize(_runs(rows), values=True), margin)


def _holm_by_hand(ps: list[float]) -> list[float]:
    """Holm's step-down: the i-th smallest p times (k − i), capped at 1, then the running maximum."""
    order = sorted(range(len(ps)), key=ps.__getitem__)
    out, running = [0.0] * len(ps), 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (len(ps) - i) * ps[j]))
        out[j] = running
    return out


def _pct(values):
    return {k: v / 100 for k, v in enumerate(values)}


# A: 50, 52, 48; B: 1.0, 1.8, 1.4 points under A on each seed; C: 51, 49, 50.5 (points)
#   A−B: mean 1.4, sd 0.4, t = 1.4/(0.4/√3) = 6.06 on 2 df, p = 0.0261: a difference on its own.
#   A−C: differences −1, 3, −2.5: p = 0.928.   B−C: differences −2, 1.2, −3.9: p = 0.403.
#   Holm over the table's 3 pairs: 3 · 0.0261 = 0.0784; 2 · 0.403 = 0.806; max(0.806, 0.928) = 0.928.
#   So A−B is not called different after the correction; with Δ = 1.4 > 1.0 not equivalent either.
HOLM_ROWS = {"A": _pct([50.0, 52.0, 48.0]), "B": _pct([49.0, 50.2, 46.6]), "C": _pct([51.0, 49.0, 50.5])}


def test_holm_turns_a_raw_difference_into_inconclusive():
    from scipy import stats

    pairs, ranking = _pairs(HOLM_ROWS)
    assert [(p.label_a, p.label_b) for p in pairs.itertuples()] == [("A", "B"), ("A", "C"), ("B", "C")]
    vals = {k: list(v.values()) for k, v in HOLM_ROWS.items()}
    raw = [stats.ttest_rel(vals[a], vals[b]).pvalue for a, b in (("A", "B"), ("A", "C"), ("B", "C"))]
    assert raw == pytest.approx([0.02615, 0.92839, 0.40286], abs=1e-5)
    assert pairs["p_value"].tolist() == pytest.approx(raw, rel=1e-9)
    assert pairs["p_holm"].tolist() == pytest.approx(_holm_by_hand(raw), rel=1e-9)
    assert pairs["p_holm"].tolist() == pytest.approx([0.07845, 0.92839, 0.80572], abs=1e-5)
    ab = pairs.iloc[0]
    assert ab["test"] == "paired" and ab["diff"] == pytest.approx(0.014) and ab["outcome"] == "inconclusive"
    assert ab["verdict"] == "inconclusive (paired, p=0.026, Holm p=0.078)"
    assert ab["p_better"] == 1.0  # A ahead of B on every seed
    # the same pair against A as the table's baseline (one test, no correction): a difference
    s = summarize(_runs(HOLM_ROWS))
    assert s.loc[s["label"] == "B", "verdict"].item() == "worse than baseline (paired, p=0.026)"
    # nothing separates the three after Holm: one letter, rows by mean (C 50.17, A 50.00, B 48.60)
    assert ranking["label"].tolist() == ["C", "A", "B"] and ranking["group"].tolist() == ["a", "a", "a"]
    assert ranking["rank"].tolist() == [1, 2, 3] and ranking["mean"].tolist() == pytest.approx([0.501667, 0.5, 0.486])


# X 60, 61, 59; Y 50, 51.5, 49.3; Z 40, 41.3, 39.2: paired p 0.00022 (X−Y), 0.000020 (X−Z), 0.000033 (Y−Z);
# Holm 3 · 0.000020, 2 · 0.000033, 0.00022: all < 0.05, so all three differ and each row has its own letter.
# No two differences of a pair tie (two of three equal is the most skewed three values can be: the
# normality check flags it and the rank tests, which cannot reach 5 % with 3 seeds, decide)
SPREAD_ROWS = {"X": _pct([60.0, 61.0, 59.0]), "Y": _pct([50.0, 51.5, 49.3]), "Z": _pct([40.0, 41.3, 39.2])}


def test_clear_differences_survive_holm_and_split_the_letters():
    pairs, ranking = _pairs(SPREAD_ROWS)
    assert pairs["outcome"].tolist() == ["better", "better", "better"]
    assert pairs["p_holm"].tolist() == pytest.approx(_holm_by_hand(pairs["p_value"].tolist()), rel=1e-9)
    assert pairs.iloc[0]["verdict"] == "better (paired, Holm p<0.001)"
    assert ranking["group"].tolist() == ["a", "b", "c"]
    # the other way round, a is the worse row: Y before X in row order
    flipped, _ = _pairs({"Y": SPREAD_ROWS["Y"], "X": SPREAD_ROWS["X"]})
    assert flipped.iloc[0]["outcome"] == "worse" and flipped.iloc[0]["p_better"] == 0.0


def test_equivalent_and_unpaired_pairs():
    from scipy import stats

    other_seeds = {3: 0.430, 4: 0.455, 5: 0.441}
    pairs, _ = _pairs({"FP32": FP32, "x128": X128, "adaptive": ADAPTIVE, "other seeds": other_seeds})
    row = pairs.set_index(["label_a", "label_b"])
    # FP32 − ×128: the negative of test_stats' equivalent case, the same TOST p (0.013)
    eq = row.loc[("FP32", "x128")]
    assert eq["outcome"] == "equivalent" and eq["verdict"] == "equivalent (±1.0, paired TOST p=0.013)"
    assert eq["diff"] == pytest.approx(-0.003) and eq["p_better"] == 0.0
    inc = row.loc[("FP32", "adaptive")]
    assert inc["outcome"] == "inconclusive" and inc["seeds_needed"] == 17
    # seeds 3, 4, 5 against 0, 1, 2: nothing to pair, Welch on the values
    welch = row.loc[("FP32", "other seeds")]
    ref = stats.ttest_ind(list(FP32.values()), list(other_seeds.values()), equal_var=False)
    assert welch["test"] == "welch" and welch["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert (welch["n_a"], welch["n_b"]) == (3, 3)
    # 44, 46, 42 against 43.0, 45.5, 44.1: 44 beats 43.0 (1 of 3), 46 all (3), 42 none: U = 4 of 9
    assert welch["p_better"] == pytest.approx(4 / 9)
    assert welch["verdict"].startswith("inconclusive (p=") and "paired" not in welch["verdict"]
    # a wider margin makes the ×128 pair no less equivalent, and changes no p-value
    wide, _ = _pairs({"FP32": FP32, "x128": X128, "adaptive": ADAPTIVE, "other seeds": other_seeds}, margin=2.0)
    assert wide["p_value"].tolist() == pairs["p_value"].tolist() and wide.iloc[0]["verdict"].startswith(
        "equivalent (±2.0"
    )


def test_rows_without_values_are_left_out_and_one_seed_is_too_few():
    rows = {"A": HOLM_ROWS["A"], "B": HOLM_ROWS["B"], "gone": "diverged", "one": {0: 0.45}}
    pairs, ranking = _pairs(rows)
    assert "gone" not in set(pairs["label_a"]) | set(pairs["label_b"]) | set(ranking["label"])
    one = pairs[pairs["label_b"] == "one"]
    assert one["verdict"].tolist() == ["too few seeds", "too few seeds"] and one["p_holm"].isna().all()
    # the family is the one testable pair: Holm p = raw p
    ab = pairs.iloc[0]
    assert ab["p_holm"] == pytest.approx(ab["p_value"]) and ab["outcome"] == "better"
    assert ranking["label"].tolist() == ["A", "B", "one"]
    assert ranking["group"].tolist() == ["a", "b", "ab"]  # the one-seed row cannot be told apart from either


def test_letter_groups_by_hand():
    assert letter_groups(["A", "B", "C"], set()) == {"A": "a", "B": "a", "C": "a"}
    assert letter_groups(["A", "B", "C"], {frozenset("AC")}) == {"A": "a", "B": "ab", "C": "b"}
    every = {frozenset(p) for p in ("AB", "AC", "BC")}
    assert letter_groups(["A", "B", "C"], every) == {"A": "a", "B": "b", "C": "c"}
    # A≠C, A≠D, B≠D: the largest sets without a different pair are {A, B}, {B, C}, {C, D}
    four = letter_groups(["A", "B", "C", "D"], {frozenset("AC"), frozenset("AD"), frozenset("BD")})
    assert four == {"A": "a", "B": "ab", "C": "bc", "D": "c"}
    # the letters follow the ranking, not the names
    assert letter_groups(["C", "B", "A"], {frozenset("AC")}) == {"C": "a", "B": "ab", "A": "b"}


def test_compare_in_every_format():
    summary = summarize(_runs({"FP32": FP32, "x128": X128, "adaptive": ADAPTIVE}), values=True)
    md = render_compare(summary, "markdown", "final_map", 1.0).splitlines()
    assert md[0] == "## s: pairwise comparisons and ranking" and "### s: SSD-tiny batch 8" in md
    md.index("### s: SSD-tiny batch 8")
    table = [[c.strip() for c in x.split("|")[1:-1]] for x in md if x.startswith("|")]
    assert table[0] == ["A", "B", "Δ A − B [95% CI]", "P(A > B) [95%]", "Verdict"]
    # equivalent: the 90% interval TOST decided on (test_stats.py), and 0 wins in 3: [0, 0.71]
    assert table[2] == [
        "FP32",
        "x128 †",
        "-0.30, 90% CI [-0.64, +0.04]",
        "0.00 [0.00, 0.71]",
        "equivalent (±1.0, paired TOST p=0.013)",
    ]
    assert table[3][:2] == ["FP32", "adaptive †"] and table[3][4].endswith("; ±1.0 needs ~17 seeds")
    assert table[5] == ["Rank", "Loss scale", "Validation mAP", "Group"]
    assert table[7] == ["1", "x128 †", "44.30 ± 1.80 (n=3)", "a"]
    assert any(x.startswith("Pairwise: every two rows") and "Holm-corrected" in x for x in md)
    assert any(x.startswith("Ranking: rows by mean") for x in md)
    assert "Metric: COCO mAP@[.5:.95] (`final_map`, %)." in md

    text = render_compare(summary, "csv", "final_map", 1.0)
    assert ",x128,fp8-e4m3-emulated,paired,3,3," in text.splitlines()[1]  # counts as counts, not 3.0
    back = pd.read_csv(io.StringIO(text))
    assert back["kind"].tolist() == ["pair"] * 3 + ["rank"] * 3
    for c in (
        "diff_pct",
        "diff_ci_low_pct",
        "half_width_pct",
        "p_value",
        "p_holm",
        "tost_p",
        "margin_pct",
        "seeds_needed",
        "p_better",
        "p_better_low",
        "p_better_high",
        "verdict",
        "group",
        "mean_pct",
    ):
        assert c in back.columns, c
    pair = back.iloc[0]
    assert pair["margin_pct"] == pytest.approx(1.0) and pair["diff_pct"] == pytest.approx(-0.3)
    assert pair["tost_p"] == pytest.approx(0.013074, abs=1e-6)
    assert back.loc[back["kind"] == "rank", "group"].tolist() == ["a", "a", "a"]

    page = render_compare(summary, "html", "final_map", 1.0)
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") == 2
    assert "<caption>Pairwise</caption>" in page and "<caption>Ranking</caption>" in page
    assert "<td>equivalent (±1.0, paired TOST p=0.013)</td>" in page
    tex = render_compare(summary, "latex", "final_map", 1.0)
    assert r"\begin{tabular}{lllll}" in tex and r"\begin{tabular}{rlrl}" in tex
    assert r"equivalent ($\pm$1.0, paired TOST p=0.013) \\" in tex and r"x128$^\dagger$" not in tex
    assert "Δ" not in tex and "±" not in tex


# --------------------------------------------------------------------------- the real CLI on a real store

RANKED = "ranked"
# seeds 0, 1, 2 in points; "saturation-aware": 1.5, 0.8, 1.1 under FP32: paired p = 0.0305 alone
RANKED_ROWS = [
    ("FP32 baseline", "fp32", [44.0, 46.0, 42.0]),
    ("loss scale (128)", "fp8-e4m3-emulated", [44.3, 46.1, 42.5]),
    ("adaptive", "fp8-e4m3-emulated", [45.5, 44.0, 43.0]),
    ("saturation-aware dynamic", "fp8-e4m3-emulated", [42.5, 45.2, 40.9]),
    ("no loss scale", "fp8-e4m3-emulated", [12.0, 13.0, 11.5]),
]


@pytest.fixture(scope="module")
def ranked_store(tmp_path_factory):
    from mlflow import MlflowClient

    runs_dir = tmp_path_factory.mktemp("ranked-runs")
    uri = f"sqlite:///{runs_dir.resolve()}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(RANKED)
    parent = client.create_run(exp, tags={"lsbench.role": "study", "lsbench.study": RANKED}).info.run_id
    for row, (label, prec, values) in enumerate(RANKED_ROWS):
        for seed, v in enumerate(values):
            _add_trial(
                client,
                exp,
                parent,
                RANKED,
                trial_id=f"r{row}-s{seed}",
                row=row,
                label=label,
                status="finished",
                bs=8,
                seed=seed,
                model="ssd_tiny",
                precision=prec,
                method="none" if row == 0 else "fixed",
                final_map=v / 100,
                eval_metric="coco",
                baseline=row == 0,
            )
    _add_trial(
        client,
        exp,
        parent,
        RANKED,
        trial_id="r5-s0",
        row=5,
        label="amax (margin=1)",
        status="diverged",
        bs=8,
        seed=0,
        model="ssd_tiny",
        precision="fp8-e4m3-emulated",
        method="amax",
        diverged_step=40,
        eval_metric="coco",
        baseline=False,
    )
    return uri


def _cells(text: str, *first: str) -> list[str]:
    """The cells of the markdown table line whose first cells are ``first``."""
    rows = [[c.strip() for c in x.split("|")[1:-1]] for x in text.splitlines() if x.startswith("|")]
    return next(r for r in rows if r[: len(first)] == list(first))


def test_cli_report_prints_the_new_verdicts(ranked_store, tmp_path):
    r = lsbench("report", "--tracking-uri", ranked_store, "--study", RANKED, "--no-plots", "--out", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # worked out by hand in test_stats.py (the same seed values)
    assert (
        _cells(r.stdout, "SSD-tiny", "loss scale (128) †")[-1]
        == "equivalent (±1.0, paired TOST p=0.013), Δ +0.30, 90% CI [-0.04, +0.64], P(>)=1.00 [0.29, 1.00]"
    )
    assert (
        _cells(r.stdout, "SSD-tiny", "adaptive †")[-1]
        == "inconclusive (paired, p=0.89), Δ +0.17 [-4.54, +4.87], P(>)=0.67 [0.09, 0.99]; ±1.0 needs ~17 seeds"
    )
    assert _cells(r.stdout, "SSD-tiny", "saturation-aware dynamic †")[-1].startswith(
        "worse than baseline (paired, p=0.031)"
    )
    # diverged on its one seed: counted against it (it used to read "no values")
    assert _cells(r.stdout, "SSD-tiny", "amax (margin=1) †")[-1] == "diverged on 1 of 1 seeds"
    assert (
        "equivalent: the 95% two one-sided tests (TOST) put the difference inside ±1.0 mAP" in r.stdout
        and "inconclusive: neither a difference nor equivalence shown at this n" in r.stdout
    )


def test_cli_compare_holm_and_ranking(ranked_store, tmp_path):
    from scipy import stats

    r = lsbench("report", "--tracking-uri", ranked_store, "--study", RANKED, "--compare", "--out", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    vals = [v for _, _, v in RANKED_ROWS]
    pairs = [(i, j) for i in range(5) for j in range(i + 1, 5)]
    raw = [stats.ttest_rel(vals[i], vals[j]).pvalue for i, j in pairs]
    by_hand = dict(zip(pairs, _holm_by_hand(raw)))
    # FP32 − saturation-aware: p = 0.031 alone ("worse than baseline" in the main table), not after Holm's
    # correction over the table's 10 pairs
    assert raw[pairs.index((0, 3))] == pytest.approx(0.030548, abs=1e-6) and by_hand[(0, 3)] > 0.05
    cells = _cells(r.stdout, "FP32 baseline", "saturation-aware dynamic †")
    assert cells[2] == "+1.13 [+0.26, +2.01]" and cells[3] == "1.00 [0.29, 1.00]"
    holm_text = f"{by_hand[(0, 3)]:.2g}"
    assert cells[4] == f"inconclusive (paired, p=0.031, Holm p={holm_text}); Δ too close to ±1.0 to show equivalence"
    assert _cells(r.stdout, "FP32 baseline", "loss scale (128) †")[4] == "equivalent (±1.0, paired TOST p=0.013)"
    assert _cells(r.stdout, "FP32 baseline", "no loss scale †")[4].startswith("better (paired, Holm p=")
    ranking = [_cells(r.stdout, str(k))[1:] for k in range(1, 6)]
    assert ranking == [
        ["loss scale (128) †", "44.30 ± 1.80 (n=3)", "a"],
        ["adaptive †", "44.17 ± 1.26 (n=3)", "a"],
        ["FP32 baseline", "44.00 ± 2.00 (n=3)", "a"],
        ["saturation-aware dynamic †", "42.87 ± 2.17 (n=3)", "a"],
        ["no loss scale †", "12.17 ± 0.76 (n=3)", "b"],
    ]
    assert "Left out (no value: diverged, failed or still running on every seed): amax (margin=1)." in r.stdout


def test_cli_margin_from_the_study_file_and_the_flag(ranked_store, tmp_path):
    study = tmp_path / "ranked.yaml"
    study.write_text(
        "name: ranked\ndataset: synthetic\nmodel: ssd_tiny\nbatch_size: 8\nprecision: fp32\n"
        "scaling: [none]\nschedule: {iterations: 10, lr: 0.001}\nreport: {equivalence_margin: 2.0}\n"
    )
    r = lsbench(
        "report", str(study), "--tracking-uri", ranked_store, "--format", "csv", "--out", f"{tmp_path}/", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "ranked.csv")
    back = pd.read_csv(tmp_path / "ranked.csv").set_index("label")
    tested = back[back["outcome"].isin(["worse", "better", "equivalent", "inconclusive"])]
    assert len(tested) == 4 and (tested["margin_pct"] == 2.0).all()
    # TOST at ±2.0 on the differences 0.3, 0.1, 0.5 (se 0.11547): max(t.sf(2.3/se, 2), t.cdf(-1.7/se, 2)) = 0.0023
    assert back.loc["loss scale (128)", "verdict"] == "equivalent (±2.0, paired TOST p=0.0023)"
    # t(0.975, n−1) · 1.893/√n <= 2.0 (test_stats: sd of adaptive's differences 1.893): 2.35 at n = 5, 1.99 at 6
    assert back.loc["adaptive", "seeds_needed"] == 6 and back.loc["adaptive", "outcome"] == "inconclusive"
    for c in ("tost_p", "half_width_pct", "seeds_needed", "p_better", "p_better_low", "p_better_high"):
        assert math.isfinite(back.loc["adaptive", c]), c
    # --margin overrides the file: at ±0.5 the ×128 row is not shown equivalent (test_stats works it out)
    r = lsbench(
        "report",
        str(study),
        "--margin",
        "0.5",
        "--tracking-uri",
        ranked_store,
        "--compare",
        "--format",
        "latex",
        "--out",
        "-",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r"FP32 baseline & loss scale (128)" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("FP32 baseline & loss scale (128)"))
    assert "inconclusive (paired, p=0.12, Holm p=" in line and r"\pm$0.5" in r.stdout


@pytest.mark.parametrize("margin", ["1e-300", "1e308"])
def test_an_extreme_margin_is_one_line_not_a_traceback(ranked_store, tmp_path, margin):
    """Found only once the statistics ran: ZeroDivisionError (1e-300) or OverflowError (1e308), exit 1."""
    for extra in ((), ("--compare",)):
        r = lsbench(
            "report",
            "--tracking-uri",
            ranked_store,
            "--study",
            RANKED,
            "--no-plots",
            "--out",
            "-",
            "--margin",
            margin,
            *extra,
            cwd=tmp_path,
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert r.stderr.startswith(f"lsbench: error: --margin {margin}: ")
    with pytest.raises(ReportError, match=r"equivalence margin 1e-300: a number of mAP points from 1e-06 to 100"):
        write_report(ranked_store, study=RANKED, out="-", plots=False, margin=1e-300)


def test_write_report_compare_paths(ranked_store, tmp_path):
    text, path = write_report(ranked_store, study=RANKED, fmt="html", compare=True, reports_dir=tmp_path)
    assert path == tmp_path / f"{RANKED}_compare.html" and path.read_text(encoding="utf-8") == text
    assert "<caption>Ranking</caption>" in text and "<img" not in text  # no plots
    text, path = write_report(ranked_store, fmt="markdown", compare=True, out=f"{tmp_path}/d/")
    assert path == tmp_path / "d" / "all_compare.md"

    for bad in (0, -1.0, math.nan, math.inf, "1"):
        with pytest.raises(ReportError, match="equivalence margin"):
            write_report(ranked_store, study=RANKED, margin=bad, reports_dir=tmp_path)
