"""Report: a real SQLite MLflow store filled the way the trial code fills it."""

from __future__ import annotations

import io
import math
import statistics

import pandas as pd
import pytest

from lossscale_bench import report
from lossscale_bench.report import ReportError, load_runs, render, summarize, write_report

STUDY = "ssd512_emu"
OTHER = "tiny_coco"


def _add_trial(
    client,
    exp_id,
    parent_id,
    study,
    *,
    trial_id,
    row,
    label,
    status,
    bs,
    seed,
    model="ssd512_vgg16",
    precision="fp16-emulated",
    method="adaptive",
    final_map=None,
    eval_metric="voc07",
    start=None,
    diverged_step=None,
    extra_params=None,
    label_tag=True,
    baseline=None,
):
    from mlflow.entities import Metric, Param

    tags = {
        "mlflow.parentRunId": parent_id,
        "lsbench.role": "trial",
        "lsbench.study": study,
        "lsbench.trial_id": trial_id,
        "lsbench.status": status,
        "lsbench.row": str(row),
        "lsbench.precision": precision,
        "lsbench.eval_metric": eval_metric,
    }
    if label_tag:
        tags["lsbench.label"] = label
    if diverged_step is not None:
        tags["lsbench.diverged_step"] = str(diverged_step)
    if baseline is not None:  # runs logged before the tag existed have none
        tags["lsbench.baseline"] = "true" if baseline else "false"
    run = client.create_run(exp_id, start_time=start, tags=tags, run_name=trial_id)
    rid = run.info.run_id
    params = {
        "model": model,
        "batch_size": str(bs),
        "seed": str(seed),
        "precision": precision,
        "scaling.method": method,
        **(extra_params or {}),
    }
    ts = 1_700_000_000_000
    metrics = [
        Metric(k, v, ts + s, s)
        for s in (0, 1)
        for k, v in (("loss", 5.0 - s), ("loss_scale", 1024.0), ("skipped_steps", 0.0))
    ]
    if final_map is not None:
        metrics += [
            Metric("map", final_map - 0.01, ts, 1),
            Metric("final_map", final_map, ts, 2),
            Metric("final_map_50", min(final_map + 0.1, 1.0), ts, 2),
            Metric("best_map", final_map, ts, 2),
        ]
    client.log_batch(rid, metrics=metrics, params=[Param(k, v) for k, v in params.items()])
    if status != "running":
        client.set_terminated(rid, "FAILED" if status == "failed" else "FINISHED")
    return rid


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlruns').resolve()}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    t0 = 1_700_000_000_000

    exp = client.create_experiment(STUDY)
    parent = client.create_run(exp, tags={"lsbench.role": "study", "lsbench.study": STUDY}).info.run_id
    T = lambda **kw: _add_trial(client, exp, parent, STUDY, **kw)  # noqa: E731
    # batch 8
    T(
        trial_id="r0-s0",
        row=0,
        label="FP32 baseline",
        status="finished",
        bs=8,
        seed=0,
        precision="fp32",
        method="none",
        final_map=0.7894,
    )
    T(
        trial_id="r0-s1",
        row=0,
        label="FP32 baseline",
        status="finished",
        bs=8,
        seed=1,
        precision="fp32",
        method="none",
        final_map=0.7900,
    )
    # trial r1-s0 has two runs (a restore): the stale earlier one must not count
    T(trial_id="r1-s0", row=1, label="adaptive", status="finished", bs=8, seed=0, final_map=0.9999, start=t0)
    T(trial_id="r1-s0", row=1, label="adaptive", status="finished", bs=8, seed=0, final_map=0.7927, start=t0 + 60_000)
    T(trial_id="r2-s0", row=2, label="adaptive (freq=10)", status="finished", bs=8, seed=0, final_map=0.7924)
    T(
        trial_id="r3-s0",
        row=3,
        label="no loss scale",
        status="diverged",
        bs=8,
        seed=0,
        method="fixed",
        diverged_step=1200,
    )
    T(trial_id="r4-s0", row=4, label="loss scale (8)", status="failed", bs=8, seed=0, method="fixed")
    T(trial_id="r5-s0", row=5, label="loss scale (128)", status="running", bs=8, seed=0, method="fixed")
    for seed, m in ((0, 0.7800), (1, 0.7820)):
        T(
            trial_id=f"r6-s{seed}",
            row=6,
            label="loss scale (dynamic, interval=10)",
            status="finished",
            bs=8,
            seed=seed,
            method="dynamic",
            final_map=m,
        )
    T(
        trial_id="r6-s2",
        row=6,
        label="loss scale (dynamic, interval=10)",
        status="diverged",
        bs=8,
        seed=2,
        method="dynamic",
        diverged_step=300,
    )
    # batch 32 (inserted out of row order on purpose)
    T(
        trial_id="b32-r5",
        row=5,
        label="loss scale (128)",
        status="finished",
        bs=32,
        seed=0,
        method="fixed",
        final_map=0.8001,
    )
    T(trial_id="b32-r1", row=1, label="adaptive", status="finished", bs=32, seed=0, final_map=0.8030)
    T(trial_id="b32-r3", row=3, label="no loss scale", status="diverged", bs=32, seed=0, method="fixed")

    exp2 = client.create_experiment(OTHER)
    parent2 = client.create_run(exp2, tags={"lsbench.role": "study", "lsbench.study": OTHER}).info.run_id
    _add_trial(
        client,
        exp2,
        parent2,
        OTHER,
        trial_id="t0",
        row=0,
        label="x",
        label_tag=False,
        status="finished",
        bs=4,
        seed=0,
        model="ssd_tiny",
        precision="mixed16",
        method="fixed",
        extra_params={"scaling.scale": "128"},
        final_map=0.25,
        eval_metric="coco",
    )
    _add_trial(
        client,
        exp2,
        parent2,
        OTHER,
        trial_id="t1",
        row=1,
        label="adaptive",
        status="finished",
        bs=4,
        seed=0,
        model="ssd_tiny",
        precision="mixed16",
        final_map=0.27,
        eval_metric="coco",
    )
    return uri


# batch 8 of ``store``: the FP32 baseline's and the dynamic row's values by seed (dynamic's seed 2 diverged)
FP32_B8_VALS, DYN_VALS = {0: 0.7894, 1: 0.7900}, {0: 0.7800, 1: 0.7820}
# scipy.stats.ttest_rel(DYN, FP32): p = 0.0511, mean difference -0.0087, 95% CI [-0.017594, +0.000194]
# (Welch's test on the same values, what the report printed before pairing: p = 0.0543, [-1.80, +0.06]).
# Not significant, and not equivalent at ±1.0 point: TOST needs the 90% interval, -0.87 ± 6.31 · 0.07 =
# [-1.31, -0.43], inside ±1.0; it is not: inconclusive. dynamic is under FP32 on both seeds: P(>) = 0/2, whose
# exact (Clopper-Pearson) interval is [0, 1 − √0.025] = [0.00, 0.84]. The per-seed differences -0.94, -0.80 points have
# sd 0.099, so 2 seeds already give a 95% half-width of 12.71 · 0.099 / √2 = 0.89 < 1.0: the interval is
# narrow enough, Δ sits too close to -1.0 for the tests to show equivalence.
DYN_VS = (
    "inconclusive (paired, p=0.051), Δ -0.87 [-1.76, +0.02], P(>)=0.00 [0.00, 0.84]; "
    "Δ too close to ±1.0 to show equivalence"
)


def _scipy_test(a, b, paired: bool):
    """(p, mean difference, CI low, CI high) from scipy alone: ``a``/``b`` map seed -> value;
    paired: ``ttest_rel`` on the common seeds, else ``ttest_ind(equal_var=False)`` on all values."""
    from scipy import stats

    if paired:
        seeds = sorted(set(a) & set(b))
        x, y = [a[k] for k in seeds], [b[k] for k in seeds]
        res = stats.ttest_rel(x, y)
    else:
        x, y = list(a.values()), list(b.values())
        res = stats.ttest_ind(x, y, equal_var=False)
    ci = res.confidence_interval(0.95)
    return float(res.pvalue), statistics.mean(x) - statistics.mean(y), float(ci.low), float(ci.high)


def _ptext(p: float) -> str:
    """p as the report words it, for a p whose two significant digits stay on its side of 0.05."""
    assert (float(f"{p:.2g}") < 0.05) == (p < 0.05)
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


def _vs_cell(verdict: str, a, b, paired: bool, tail: str = "") -> str:
    """The ``vs baseline`` cell as the report words it, in mAP %, for a p whose two significant
    digits stay on its side of 0.05 (format_p's own rule is tested on its own); ``tail``: what follows
    the interval (P(>) and, for an inconclusive row, the seeds it needs), worked out beside each use."""
    p, d, lo, hi = _scipy_test(a, b, paired)
    assert (p < 0.05) == verdict.startswith(("worse", "better"))
    return (
        f"{verdict} ({'paired, ' if paired else ''}{_ptext(p)}), Δ {100 * d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]"
        + tail
    )


@pytest.fixture(scope="module")
def runs(store):
    return load_runs(store, STUDY)


def test_load_runs_one_row_per_trial(runs):
    assert runs["study"].eq(STUDY).all()
    assert len(runs) == 13  # 14 trial runs, one trial_id twice; parent run excluded
    assert runs["trial_id"].is_unique
    for c in (
        "study",
        "trial_id",
        "run_id",
        "status",
        "label",
        "row",
        "model",
        "batch_size",
        "seed",
        "precision",
        "method",
        "final_map",
        "final_map_50",
        "best_map",
        "diverged_step",
        "eval_metric",
    ):
        assert c in runs.columns
    r = runs.set_index("trial_id")
    assert r.loc["r1-s0", "final_map"] == pytest.approx(0.7927)  # the latest run of the trial
    assert r.loc["r3-s0", "diverged_step"] == 1200
    assert r.loc["r3-s0", "status"] == "diverged"
    assert r.loc["r0-s1", "seed"] == 1 and r.loc["r0-s1", "batch_size"] == 8
    assert r.loc["r6-s0", "method"] == "dynamic"
    assert pd.isna(r.loc["r5-s0", "final_map"])
    assert r.loc["r0-s0", "loss"] == pytest.approx(4.0)  # step metrics: latest value


def test_load_all_studies_and_derived_label(store):
    df = load_runs(store)
    assert sorted(df["study"].unique()) == sorted([OTHER, STUDY])
    assert len(df) == 15
    tiny = df[df["study"] == OTHER].set_index("trial_id")
    assert tiny.loc["t0", "label"] == "loss scale (128)"  # no lsbench.label tag: derived from params


def test_unknown_study(store):
    with pytest.raises(ReportError) as e:
        load_runs(store, "nope")
    msg = str(e.value)
    assert "no study named 'nope'" in msg and store in msg
    assert STUDY in msg and OTHER in msg and "\n" not in msg


def test_summarize_mean_std(runs):
    s = summarize(runs)
    cell = s[(s["batch_size"] == 8) & (s["row"] == 0)].iloc[0]
    assert cell["n_runs"] == 2 and cell["n_seeds"] == 2 and cell["n_values"] == 2
    assert cell["mean"] == pytest.approx(statistics.mean([0.7894, 0.7900]))
    assert cell["std"] == pytest.approx(statistics.stdev([0.7894, 0.7900]))
    assert cell["cell"] == "78.97 ± 0.04 (n=2)"
    dyn = s[(s["batch_size"] == 8) & (s["row"] == 6)].iloc[0]
    assert (dyn["n_runs"], dyn["n_values"], dyn["n_diverged"]) == (3, 2, 1)
    assert dyn["std"] == pytest.approx(statistics.stdev([0.78, 0.782]))
    assert dyn["cell"] == "78.10 ± 0.14 (n=2, 1/3 diverged)"
    adaptive = s[(s["batch_size"] == 8) & (s["row"] == 1)].iloc[0]
    assert adaptive["n_runs"] == 1 and adaptive["best"]  # duplicate run counted once
    assert s["best"].sum() == 2  # one per table


def test_markdown_exact(runs):
    lines = render(runs, "markdown").splitlines()
    i = lines.index(f"### {STUDY}: SSD512 batch 8")
    # batch 8 has an fp32 row: it is the baseline (no entry is marked), so the table has verdicts.
    # dynamic finished seeds 0 and 1, the baseline's seeds (its diverged seed 2 is left out): paired test.
    # The adaptive rows have seed 0 only: Welch's test, which needs two values a side: too few seeds.
    assert _vs_cell("inconclusive", DYN_VALS, FP32_B8_VALS, paired=True, tail=DYN_VS[DYN_VS.index(", P") :]) == DYN_VS
    w = len(DYN_VS)
    assert lines[i + 1 : i + 12] == [
        "",
        "| Model  | Loss scale                          | Batch size | Validation mAP                   | "
        f"{'vs baseline':<{w}} |",
        f"| ------ | ----------------------------------- | ---------- | -------------------------------- | {'-' * w} |",
        "| SSD512 | FP32 baseline                       | 8          | 78.97 ± 0.04 (n=2)               | "
        f"{'baseline':<{w}} |",
        "| SSD512 | adaptive †                          | 8          | **79.27**                        | "
        f"{'too few seeds':<{w}} |",
        "| SSD512 | adaptive (freq=10) †                | 8          | 79.24                            | "
        f"{'too few seeds':<{w}} |",
        "| SSD512 | no loss scale †                     | 8          | diverged                         | "
        f"{'no values':<{w}} |",
        "| SSD512 | loss scale (8) †                    | 8          | failed                           | "
        f"{'no values':<{w}} |",
        "| SSD512 | loss scale (128) †                  | 8          | –                                | "
        f"{'no values':<{w}} |",
        f"| SSD512 | loss scale (dynamic, interval=10) † | 8          | 78.10 ± 0.14 (n=2, 1/3 diverged) | {DYN_VS} |",
        "",
    ]
    j = lines.index(f"### {STUDY}: SSD512 batch 32")
    assert j > i
    # batch 32 has no fp32 row and no marked one: no baseline, no verdict column
    assert lines[j + 1 : j + 8] == [
        "",
        "| Model  | Loss scale         | Batch size | Validation mAP |",
        "| ------ | ------------------ | ---------- | -------------- |",
        "| SSD512 | adaptive †         | 32         | **80.30**      |",
        "| SSD512 | no loss scale †    | 32         | diverged       |",
        "| SSD512 | loss scale (128) † | 32         | 80.01          |",
        "",
    ]
    assert lines[0] == f"## {STUDY}"
    assert sum(line.startswith("### ") for line in lines) == 2
    assert lines[j + 8 :] == [
        "Metric: VOC07 11-point mAP (`final_map`, %). Best per table in bold.",
        "",
        report.SEEDS_NOTE,
        "",
        report.verdict_note("final_map", 1.0),
        "",
        "Trials: 13 (8 finished, 3 diverged, 1 failed, 1 running).",
        "",
        "† fp16-emulated: these numbers come from the CPU fp16 emulation (compute in fp32, "
        "fp16 rounding of layer outputs and gradients), not real fp16.",
    ]


def test_no_emulation_note_without_emulated_runs(store):
    md = render(load_runs(store, OTHER), "markdown")
    assert "†" not in md and "emulation" not in md
    # one seed per cell and no baseline row: neither the seeds note nor the verdict column
    assert "Several seeds" not in md and "vs baseline" not in md
    assert "Metric: COCO mAP@[.5:.95] (`final_map`, %)." in md
    assert "| SSD-tiny | loss scale (128) | 4          | 25.00          |" in md.splitlines()
    md50 = render(load_runs(store, OTHER), "markdown", metric="final_map_50")
    assert "Metric: COCO mAP@0.5 (`final_map_50`, %)." in md50
    assert "**37.00**" in md50


def test_csv_parse_back(runs):
    text = render(runs, "csv")
    back = pd.read_csv(io.StringIO(text))
    # mAP numbers in percent, like the cell text, and the header says so
    from lossscale_bench.report.renderers.csv import PERCENT_COLUMNS

    assert list(back.columns) == [f"{c}_pct" if c in PERCENT_COLUMNS else c for c in report.SUMMARY_COLUMNS]
    assert len(back) == 10  # 7 rows at batch 8, 3 at batch 32
    row = back[(back["batch_size"] == 8) & (back["row"] == 0)].iloc[0]
    assert row["mean_pct"] == pytest.approx(78.97) and row["cell"] == "78.97 ± 0.04 (n=2)"
    assert row["n"] == 2 and row["std_pct"] == pytest.approx(100 * statistics.stdev([0.7894, 0.79]))
    assert row["baseline"] and row["verdict"] == "baseline" and row["baseline_label"] == "FP32 baseline"
    dyn = back[(back["batch_size"] == 8) & (back["row"] == 6)].iloc[0]
    p, d, lo, hi = _scipy_test(DYN_VALS, FP32_B8_VALS, paired=True)
    assert dyn["test"] == "paired" and dyn["verdict"] == "inconclusive (paired, p=0.051)"
    assert dyn["outcome"] == "inconclusive" and dyn["margin_pct"] == pytest.approx(1.0)
    assert (dyn["p_better"], dyn["p_better_low"], dyn["seeds_needed"]) == (0, 0, 2)
    assert dyn["p_better_high"] == pytest.approx(1 - math.sqrt(0.025))
    assert dyn["p_value"] == pytest.approx(p, rel=1e-9) and dyn["diff_pct"] == pytest.approx(100 * d)
    assert (dyn["diff_ci_low_pct"], dyn["diff_ci_high_pct"]) == (pytest.approx(100 * lo), pytest.approx(100 * hi))
    # one seed (too few seeds), the baseline row and tables without one: no test ran, none named
    assert back.loc[(back["batch_size"] == 8) & back["row"].isin([1, 2]), "test"].isna().all()
    assert back.loc[back["baseline"] | (back["batch_size"] == 32), "test"].isna().all()
    assert report.SUMMARY_COLUMNS.index("test") == report.SUMMARY_COLUMNS.index("verdict") - 1
    assert back.loc[back["batch_size"] == 32, "verdict"].isna().all()  # no baseline there
    assert back.loc[back["best"], "cell"].tolist() == ["79.27", "80.30"]
    assert back[back["row"] == 3]["cell"].eq("diverged").all()


def test_latex_escaping(runs):
    tex = render(runs, "latex")
    assert r"\begin{tabular}{llrll}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"\begin{tabular}{llrl}" in tex  # batch 32: no baseline, no verdict column
    assert tex.count(r"\begin{tabular}") == 2
    assert r"SSD512 & FP32 baseline & 8 & 78.97 $\pm$ 0.04 (n=2) & baseline \\" in tex
    assert r"SSD512 & adaptive$^\dagger$ & 8 & \textbf{79.27} & too few seeds \\" in tex
    assert r"SSD512 & adaptive$^\dagger$ & 32 & \textbf{80.30} \\" in tex
    assert (
        r"inconclusive (paired, p=0.051), $\Delta$ -0.87 [-1.76, +0.02], P(\textgreater{})=0.00 [0.00, 0.84]; "
        r"$\Delta$ too close to $\pm$1.0 to show equivalence \\" in tex
    )
    assert r"\caption{ssd512\_emu: SSD512 batch 8}" in tex
    assert r"\texttt{final\_map}, \%" in tex
    assert "±" not in tex and "–" not in tex and "Δ" not in tex and "−" not in tex
    assert report.latex_escape("a_b 50% & c") == r"a\_b 50\% \& c"


def test_html_contains_tables_and_images(runs):
    page = render(runs, "html", images={"loss_scale": b"\x89PNG fake"})
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<table>") == 2
    assert "<th>Validation mAP</th><th>vs baseline</th>" in page
    assert '<td class="num"><strong>79.27</strong></td><td>too few seeds</td>' in page
    assert '<td class="num"><strong>80.30</strong></td></tr>' in page  # batch 32: no verdict column
    assert "78.10 ± 0.14 (n=2, 1/3 diverged)" in page
    assert 'src="data:image/png;base64,iVBORyBmYWtl"' in page
    assert "http" not in page.replace('lang="en"', "")  # self-contained


def test_write_report_paths(store, tmp_path):
    text, path = write_report(store, study=STUDY, reports_dir=tmp_path / "reports")
    assert path == tmp_path / "reports" / f"{STUDY}.md" and path.read_text(encoding="utf-8") == text
    text, path = write_report(store, fmt="latex", reports_dir=tmp_path / "reports")
    assert path.name == "all.tex" and f"% study: {OTHER.replace('_', chr(92) + '_')}" in text
    out = tmp_path / "x" / "r.csv"
    text, path = write_report(store, study=OTHER, fmt="csv", out=out)
    assert path == out and out.read_text(encoding="utf-8") == text
    with pytest.raises(ReportError, match="unknown report format"):
        write_report(store, fmt="pdf", reports_dir=tmp_path)


def test_cell_rules():
    base = dict(study="s", model="ssd_tiny", batch_size=4, precision="mixed16", eval_metric="voc")
    rows = [
        dict(base, trial_id="a0", row=0, label="a", seed=0, status="finished", final_map=0.5),
        dict(base, trial_id="a1", row=0, label="a", seed=1, status="finished", final_map=0.5),
        dict(base, trial_id="b0", row=1, label="b", seed=0, status="finished", final_map=0.4),
        dict(base, trial_id="c0", row=2, label="c", seed=0, status="diverged", final_map=None),
        dict(base, trial_id="c1", row=2, label="c", seed=1, status="running", final_map=None),
        dict(base, trial_id="d0", row=3, label="d", seed=0, status="finished", final_map=None),
        dict(base, trial_id="d1", row=3, label="d", seed=1, status="finished", final_map=None),
        dict(base, trial_id="e0", row=4, label="e", seed=0, status="pending", final_map=None),
        dict(base, trial_id="e1", row=4, label="e", seed=1, status="failed", final_map=None),
    ]
    s = summarize(pd.DataFrame(rows)).set_index("label")
    assert s.loc["a", "cell"] == "50.00 ± 0.00 (n=2)" and s.loc["a", "best"]
    assert s.loc["b", "cell"] == "40.00 (n=1)"
    assert s.loc["c", "cell"] == "– (1/2 diverged)"
    assert s.loc["d", "cell"] == "–"  # finished but no metric logged
    # pending reads as not done yet, and is counted as pending, as in the Trials line below
    assert s.loc["e", "cell"] == "– (1/2 failed, 1/2 pending)"
    md = render(pd.DataFrame(rows), "markdown")
    assert "Trials: 9 (5 finished, 1 diverged, 1 failed, 1 running, 1 pending)." in md.splitlines()
    # a single value is not bolded: nothing to compare with
    one = summarize(pd.DataFrame(rows[2:3]))
    assert not one["best"].any()


# --------------------------------------------------------------------------
# seeds and statistics: a second store with known seed values

NOISY = "noisy"
ONE_SEED = "one_seed"
BASE_VALS, BAD_VALS, OK_VALS = [0.50, 0.51, 0.49], [0.10, 0.12, 0.11], [0.505, 0.49, 0.51]
MARKED_VALS, FP32_VALS = [0.40, 0.41, 0.42], [0.60, 0.61, 0.59]
# batch 8, beside BASE_VALS (seeds 0, 1, 2):
# CLOSE: seeds 0, 1, 2, each about 1.1 points under the baseline's same seed, well inside the seed-to-seed
#   spread (2 points): Welch sees noise, the paired test sees a consistent loss
# SHIFTED: seeds 3, 4, 5, 3 points under BASE_VALS position by position; no seed in common, so Welch. Were
#   they (wrongly) paired by position, the differences would be all equal: "no seed variance"
# PARTIAL: seeds 0 and 1 of the baseline's three: not the same seeds, so Welch on 2 values against 3
CLOSE_VALS = [0.489, 0.499, 0.480]
SHIFTED_VALS = {3: 0.47, 4: 0.48, 5: 0.46}
PARTIAL_VALS = {0: 0.47, 1: 0.52}


def _by_seed(values):
    return dict(enumerate(values)) if isinstance(values, list) else dict(values)


@pytest.fixture(scope="module")
def stats_store(tmp_path_factory):
    """``noisy``: batch 8 has an fp32 row and no marked one; batch 16 marks a non-fp32 row
    ``baseline: true`` beside an fp32 row.  ``one_seed``: one seed per cell."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlruns-stats').resolve()}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(NOISY)
    parent = client.create_run(exp, tags={"lsbench.role": "study", "lsbench.study": NOISY}).info.run_id

    def rows(bs, row, label, values, **kw):  # values: a list (seeds 0, 1, ...) or seed -> value
        for seed, v in _by_seed(values).items():
            _add_trial(
                client,
                exp,
                parent,
                NOISY,
                trial_id=f"b{bs}-r{row}-s{seed}",
                row=row,
                label=label,
                status="finished",
                bs=bs,
                seed=seed,
                final_map=v,
                **kw,
            )

    rows(8, 0, "FP32 baseline", BASE_VALS, precision="fp32", method="none", baseline=False)
    rows(8, 1, "bad", BAD_VALS, precision="fp8-emulated", baseline=False)
    rows(8, 2, "ok", OK_VALS, baseline=False)
    _add_trial(
        client,
        exp,
        parent,
        NOISY,
        trial_id="b8-r2-s3",
        row=2,
        label="ok",
        status="diverged",
        bs=8,
        seed=3,
        diverged_step=40,
        baseline=False,
    )
    rows(8, 3, "close", CLOSE_VALS, baseline=False)
    rows(8, 4, "other seeds", SHIFTED_VALS, baseline=False)
    rows(8, 5, "partial", PARTIAL_VALS, baseline=False)
    rows(16, 0, "FP32 baseline", FP32_VALS, precision="fp32", method="none", baseline=False)
    rows(16, 1, "adaptive", MARKED_VALS, precision="mixed16", baseline=True)
    rows(16, 2, "dynamic", [0.41, 0.40, 0.415], precision="mixed16", method="dynamic", baseline=False)

    exp2 = client.create_experiment(ONE_SEED)
    parent2 = client.create_run(exp2, tags={"lsbench.role": "study", "lsbench.study": ONE_SEED}).info.run_id
    for row, (label, prec, v) in enumerate((("FP32 baseline", "fp32", 0.5), ("adaptive", "mixed16", 0.45))):
        _add_trial(
            client,
            exp2,
            parent2,
            ONE_SEED,
            trial_id=f"o{row}",
            row=row,
            label=label,
            status="finished",
            bs=4,
            seed=0,
            precision=prec,
            method="none" if prec == "fp32" else "adaptive",
            final_map=v,
        )
    return uri


def _cell(summary, bs, row):
    return summary[(summary["batch_size"] == bs) & (summary["row"] == row)].iloc[0]


def test_verdicts_against_the_fp32_row(stats_store):
    from scipy import stats

    s = summarize(load_runs(stats_store, NOISY))
    base = _cell(s, 8, 0)
    assert base["baseline"] and base["verdict"] == "baseline" and math.isnan(base["p_value"])
    assert base["cell"] == "50.00 ± 1.00 (n=3)" and base["n"] == 3

    assert base["test"] == ""  # the baseline row is not tested against itself

    # same seeds 0, 1, 2 as the baseline: paired, seed by seed
    bad = _cell(s, 8, 1)
    ref = stats.ttest_rel(BAD_VALS, BASE_VALS)
    assert bad["test"] == "paired"
    assert bad["p_value"] == pytest.approx(ref.pvalue, rel=1e-9) and bad["p_value"] < 0.001
    assert bad["verdict"] == "worse than baseline (paired, p<0.001)"
    assert bad["diff"] == pytest.approx(statistics.mean(BAD_VALS) - statistics.mean(BASE_VALS))
    ci = ref.confidence_interval(0.95)
    assert (bad["diff_ci_low"], bad["diff_ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert bad["diff_ci_high"] < 0 and bad["baseline_label"] == "FP32 baseline"

    ok = _cell(s, 8, 2)  # the diverged seed 3 is left out: seeds 0, 1, 2 finished, the baseline's: paired
    ref = stats.ttest_rel(OK_VALS, BASE_VALS)
    assert ok["test"] == "paired" and ok["n"] == 3 and ok["n_diverged"] == 1
    assert ok["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert ok["verdict"] == f"inconclusive (paired, {_ptext(ref.pvalue)})" == "inconclusive (paired, p=0.9)"
    assert ok["diff_ci_low"] < 0 < ok["diff_ci_high"]
    assert ok["cell"] == "50.17 ± 1.04 (n=3, 1/4 diverged)"


def test_same_seeds_are_paired_other_seeds_fall_back_to_welch(stats_store):
    from scipy import stats

    s = summarize(load_runs(stats_store, NOISY))
    close = _cell(s, 8, 3)  # same seeds: paired finds the consistent 1-point loss that Welch calls noise
    ref = stats.ttest_rel(CLOSE_VALS, BASE_VALS)
    assert close["test"] == "paired" and close["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert close["verdict"] == f"worse than baseline (paired, {_ptext(ref.pvalue)})"
    welch = stats.ttest_ind(CLOSE_VALS, BASE_VALS, equal_var=False)
    assert ref.pvalue < 0.05 < welch.pvalue

    other = _cell(s, 8, 4)  # seeds 3, 4, 5 against 0, 1, 2: nothing to pair, Welch on the values
    ref = stats.ttest_ind(list(SHIFTED_VALS.values()), BASE_VALS, equal_var=False)
    assert other["test"] == "welch" and other["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert other["verdict"] == f"worse than baseline ({_ptext(ref.pvalue)})" and "paired" not in other["verdict"]
    ci = ref.confidence_interval(0.95)
    assert (other["diff_ci_low"], other["diff_ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))

    partial = _cell(s, 8, 5)  # seeds 0, 1 of the baseline's 0, 1, 2: not the same seeds, Welch on 2 against 3
    ref = stats.ttest_ind(list(PARTIAL_VALS.values()), BASE_VALS, equal_var=False)
    assert partial["test"] == "welch" and partial["n"] == 2
    assert partial["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert partial["verdict"] == f"inconclusive ({_ptext(ref.pvalue)})"

    md = render(load_runs(stats_store, NOISY), "markdown").splitlines()

    def vs_column(label):
        return next(x for x in md if f"| {label} †" in x).strip("|").split("|")[-1].strip()

    base = _by_seed(BASE_VALS)
    # every value of "other seeds" is under every baseline value: U = 0 of 3·3 pairs (unpaired: no interval)
    assert vs_column("other seeds") == _vs_cell(
        "worse than baseline", SHIFTED_VALS, base, paired=False, tail=", P(>)=0.00"
    )
    # close is under the baseline on all 3 seeds: 0 in 3, Clopper-Pearson [0, 1 − 0.025^(1/3)] = [0, 0.71]
    assert vs_column("close") == _vs_cell(
        "worse than baseline", _by_seed(CLOSE_VALS), base, paired=True, tail=", P(>)=0.00 [0.00, 0.71]"
    )
    # partial (47, 52) against (50, 51, 49): 52 beats all three, 47 none: U = 3 of 6, P = 0.50; Welch's
    # half-width with equal n, sd 3.54 and 1.00 points: t(0.975, df(n))·√((12.5 + 1)/n) <= 1.0 first at
    # n = 54, where df = 13.5²·53/(12.5² + 1²) = 61.4 and t = 1.9993: 1.9993·√(13.5/54) = 0.9997 (n = 53: 1.009)
    assert vs_column("partial") == _vs_cell(
        "inconclusive", PARTIAL_VALS, base, paired=False, tail=", P(>)=0.50; ±1.0 needs ~54 seeds per row"
    )


def test_baseline_true_picks_a_non_fp32_row(stats_store):
    from scipy import stats

    s = summarize(load_runs(stats_store, NOISY))
    fp32, marked, dyn = _cell(s, 16, 0), _cell(s, 16, 1), _cell(s, 16, 2)
    assert marked["baseline"] and marked["verdict"] == "baseline" and not fp32["baseline"]
    ref = stats.ttest_rel(FP32_VALS, MARKED_VALS)  # all three rows ran seeds 0, 1, 2: paired
    assert fp32["verdict"] == f"better than baseline (paired, {_ptext(ref.pvalue)})"
    assert fp32["baseline_label"] == "adaptive" and fp32["test"] == "paired"
    assert fp32["p_value"] == pytest.approx(ref.pvalue, rel=1e-9) and fp32["diff"] == pytest.approx(0.19)
    ref = stats.ttest_rel([0.41, 0.40, 0.415], MARKED_VALS)
    assert dyn["verdict"] == f"inconclusive (paired, {_ptext(ref.pvalue)})" and dyn["test"] == "paired"
    assert dyn["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)


def test_verdict_column_and_notes_in_every_format(stats_store):
    runs = load_runs(stats_store, NOISY)
    md = render(runs, "markdown")
    assert md.count("| vs baseline") == 2
    bad_line = next(line for line in md.splitlines() if "| bad †" in line)
    # scipy.stats.ttest_rel on the same numbers: p = 0.00022, 95% CI of the difference [-0.4148, -0.3652]
    # bad is under the baseline on every seed: P(>) = 0/3, Clopper-Pearson [0, 0.71]
    bad_vs = _vs_cell(
        "worse than baseline", _by_seed(BAD_VALS), _by_seed(BASE_VALS), paired=True, tail=", P(>)=0.00 [0.00, 0.71]"
    )
    assert bad_vs == "worse than baseline (paired, p<0.001), Δ -39.00 [-41.48, -36.52], P(>)=0.00 [0.00, 0.71]"
    assert bad_line.split("|")[-2].strip() == bad_vs
    assert report.SEEDS_NOTE in md and report.verdict_note("final_map", 1.0) in md
    assert "alpha 0.05" in md and "left out of the test" in md
    assert "paired t-test of the per-seed differences" in md and "Welch's t-test" in md
    # both emulations appear, each named with what it rounds
    assert "† fp16-emulated: " in md and "† fp8-emulated: " in md and "E4M3" in md and "E5M2" in md
    html_page = render(runs, "html")
    assert "<th>vs baseline</th>" in html_page and "<td>baseline</td>" in html_page
    assert "bad †" in html_page
    tex = render(runs, "latex")
    assert tex.count(r"\begin{tabular}{llrll}") == 2 and r"bad$^\dagger$" in tex
    back = pd.read_csv(io.StringIO(render(runs, "csv")))
    for c in (
        "mean_pct",
        "std_pct",
        "n",
        "cell",
        "p_value",
        "diff_pct",
        "diff_ci_low_pct",
        "diff_ci_high_pct",
        "test",
        "verdict",
        "baseline_label",
        "baseline",
        "half_width_pct",
        "tost_p",
        "margin_pct",
        "seeds_needed",
        "p_better",
        "p_better_low",
        "p_better_high",
        "outcome",
    ):  # mAP in %, said by the header
        assert c in back.columns, c
    bad = back[(back["batch_size"] == 8) & (back["row"] == 1)].iloc[0]
    assert bad["n"] == 3 and bad["verdict"].startswith("worse than baseline (paired") and bad["test"] == "paired"
    assert back.loc[(back["batch_size"] == 8) & back["row"].isin([4, 5]), "test"].eq("welch").all()
    # a summary read back from csv renders the same tables (empty verdicts come back as NaN)
    assert render(back, "markdown") == render(summarize(runs), "markdown")


def test_one_seed_study_says_too_few_seeds_and_no_seeds_note(stats_store):
    runs = load_runs(stats_store, ONE_SEED)
    s = summarize(runs)
    assert s["verdict"].tolist() == ["baseline", "too few seeds"]
    assert s["p_value"].isna().all()
    md = render(runs, "markdown")
    assert "Several seeds" not in md and "± " not in md and "(n=" not in md
    assert "| SSD512 | adaptive      | 4          | 45.00          | too few seeds |" in md.splitlines()
    # one common seed is too few to pair, and one value a side too few for Welch's test: no test ran, and the
    # test column says none (it said "welch")
    assert s["test"].tolist() == ["", ""]
    # the column is there, so is its explanation
    assert "vs baseline: the row's seed values against the baseline row's" in md
    assert report.verdict_note("final_map", 1.0) in md


def test_emulated_precisions_are_marked():
    """From the precision table (its ``emulated`` field), never from the name: a name no entry has
    (``fp4-emulated``, a precision since renamed) is not marked for its suffix."""
    base = dict(study="s", model="ssd_tiny", batch_size=4, eval_metric="voc", status="finished", seed=0)
    rows = [
        dict(base, trial_id="a", row=0, label="a", precision="fp8-emulated", final_map=0.3),
        dict(base, trial_id="b", row=1, label="b", precision="e4m3fwd-nvfp4grad-emulated", final_map=0.2),
        dict(base, trial_id="c", row=2, label="c", precision="bf16", final_map=0.1),
        dict(base, trial_id="d", row=3, label="d", precision="fp4-emulated", final_map=0.1),
    ]
    md = render(pd.DataFrame(rows), "markdown")
    assert "| a † " in md and "| b † " in md and "| c " in md and "| c †" not in md and "| d †" not in md
    assert "† fp8-emulated: " in md and "† e4m3fwd-nvfp4grad-emulated: these numbers come from the CPU FP4" in md
    assert "fp16-emulated" not in md and "† fp4-emulated" not in md


TAGGED = (
    "name: tagged\ndataset: {name: synthetic}\nmodel: ssd_tiny\nbatch_size: 4\nprecision: fp8-emulated\n"
    "scaling:\n  - {method: none, precision: fp32FP32}\n  - {method: adaptiveADAPTIVE}\n"
    "schedule: {iterations: 10, lr: 1e-3}\n"
)


def _tagged(marked: str):
    """The ``tagged`` study with ``baseline: true`` on the fp32 or the adaptive entry."""
    from lossscale_bench.study import load_study_text

    text = TAGGED.replace("FP32", ", baseline: true" if marked == "fp32" else "")
    return load_study_text(text.replace("ADAPTIVE", ", baseline: true" if marked == "adaptive" else "")).trials()


def _marked(uri):
    runs = load_runs(uri, "tagged").set_index("label")
    return [label for label in ("FP32 baseline", "adaptive") if runs.loc[label, "baseline"]]


def test_tracker_writes_baseline_and_emulated_tags(tmp_path):
    """The trial code's own tags, read back by the report."""
    from lossscale_bench.tracking import Tracker

    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    tracker = Tracker(uri)
    exp, parent = tracker.study_run("tagged")
    ids = {t.label: tracker.ensure_trial_run(exp, parent, t) for t in _tagged("adaptive")}
    tags = {label: tracker.client.get_run(rid).data.tags for label, rid in ids.items()}
    assert tags["FP32 baseline"]["lsbench.baseline"] == "false" and tags["adaptive"]["lsbench.baseline"] == "true"
    assert tags["FP32 baseline"]["lsbench.emulated"] == "false" and tags["adaptive"]["lsbench.emulated"] == "true"
    assert _marked(uri) == ["adaptive"]
    # a continued run takes the study's current choice of baseline (trial ids did not change)
    existing = tracker.trial_runs(exp)
    for t in _tagged("fp32"):
        assert tracker.ensure_trial_run(exp, parent, t, existing[t.trial_id]) == ids[t.label]
    assert _marked(uri) == ["FP32 baseline"]
    # finished runs (a re-run skips them) are brought up to date by sync_baseline_tags
    for rid in ids.values():
        tracker.end_trial(rid, "finished")
    assert tracker.sync_baseline_tags(_tagged("adaptive"), tracker.trial_runs(exp)) == 2
    assert tracker.sync_baseline_tags(_tagged("adaptive"), tracker.trial_runs(exp)) == 0
    assert _marked(uri) == ["adaptive"]


@pytest.mark.parametrize(
    "params,precision,label",
    [
        ({"scaling.method": "none"}, "fp32", "FP32 baseline"),
        (
            {"scaling.method": "fixed", "scaling.scale": "128.0", "scaling.skip_nonfinite": "True"},
            "fp16-emulated",
            "loss scale (128)",
        ),
        (
            {
                "scaling.method": "dynamic",
                "scaling.style": "torch",
                "scaling.interval": "2000",
                "scaling.init_scale": "65536.0",
            },
            "mixed16",
            "loss scale (dynamic, torch, interval=2000)",
        ),
        ({"scaling.method": "adaptive", "scaling.update_every": "10"}, "mixed16", "adaptive (freq=10)"),
        (
            {"scaling.method": "layerwise_dynamic", "scaling.interval": "100", "scaling.init_scale": "1024.0"},
            "fp8-emulated",
            "layer-wise dynamic (interval=100, init=1024)",
        ),
    ],
)
def test_stored_runs_are_labelled_by_the_study_label_code(params, precision, label):
    """A run without an ``lsbench.label`` tag gets the label a study entry of the same scaling gets."""
    from lossscale_bench.report.runs import derive_label
    from lossscale_bench.study import default_label, load_study_text

    assert derive_label(params, precision) == label
    entry = {k.split(".", 1)[1]: v for k, v in params.items()}
    yaml_entry = "{" + ", ".join(f"{k}: {v}" for k, v in entry.items()) + "}"
    study = load_study_text(
        f"name: t\ndataset: synthetic\nmodel: ssd_tiny\nbatch_size: 8\nprecision: {precision}\n"
        f"scaling: [{yaml_entry}]\nschedule: {{iterations: 10, lr: 0.001}}\n"
    )
    assert study.trials()[0].label == label == default_label(study.trials()[0].scaling, precision)


def test_an_interrupted_trial_is_counted_as_interrupted_not_running():
    """A study stopped by SIGINT leaves its unstarted trials ``interrupted``; the cell counted them as
    "running" while the Trials line under the table said "interrupted" (seen on the ranking study)."""
    from lossscale_bench.report.cell_text import NOT_VALUE, format_cell

    counts = {k: 0 for k in NOT_VALUE}
    counts["interrupted"] = 5
    text = format_cell([0.42, 0.44], counts, n_runs=7, table_n_runs=7, metric="final_map")
    assert "5/7 interrupted" in text and "running" not in text
    counts = {k: 0 for k in NOT_VALUE}
    counts["interrupted"] = 2
    assert format_cell([], counts, n_runs=2, table_n_runs=2, metric="final_map") == "interrupted"
