"""Report: a real SQLite MLflow store filled the way the trial code fills it."""

from __future__ import annotations

import io
import statistics

import pandas as pd
import pytest

from lossscale_bench import report
from lossscale_bench.report import ReportError, load_runs, render, summarize, write_report

STUDY = "ssd512_emu"
OTHER = "tiny_coco"


def _add_trial(client, exp_id, parent_id, study, *, trial_id, row, label, status, bs, seed,
               model="ssd512_vgg16", precision="fp16-emulated", method="adaptive",
               final_map=None, eval_metric="voc07", start=None, diverged_step=None,
               extra_params=None, label_tag=True):
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
    run = client.create_run(exp_id, start_time=start, tags=tags, run_name=trial_id)
    rid = run.info.run_id
    params = {"model": model, "batch_size": str(bs), "seed": str(seed), "precision": precision,
              "scaling.method": method, **(extra_params or {})}
    ts = 1_700_000_000_000
    metrics = [Metric(k, v, ts + s, s) for s in (0, 1)
               for k, v in (("loss", 5.0 - s), ("loss_scale", 1024.0), ("skipped_steps", 0.0))]
    if final_map is not None:
        metrics += [Metric("map", final_map - 0.01, ts, 1), Metric("final_map", final_map, ts, 2),
                    Metric("final_map_50", min(final_map + 0.1, 1.0), ts, 2),
                    Metric("best_map", final_map, ts, 2)]
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
    T(trial_id="r0-s0", row=0, label="FP32 baseline", status="finished", bs=8, seed=0,
      precision="fp32", method="none", final_map=0.7894)
    T(trial_id="r0-s1", row=0, label="FP32 baseline", status="finished", bs=8, seed=1,
      precision="fp32", method="none", final_map=0.7900)
    # trial r1-s0 has two runs (a restore): the stale earlier one must not count
    T(trial_id="r1-s0", row=1, label="adaptive", status="finished", bs=8, seed=0,
      final_map=0.9999, start=t0)
    T(trial_id="r1-s0", row=1, label="adaptive", status="finished", bs=8, seed=0,
      final_map=0.7927, start=t0 + 60_000)
    T(trial_id="r2-s0", row=2, label="adaptive (freq=10)", status="finished", bs=8, seed=0, final_map=0.7924)
    T(trial_id="r3-s0", row=3, label="no loss scale", status="diverged", bs=8, seed=0,
      method="fixed", diverged_step=1200)
    T(trial_id="r4-s0", row=4, label="loss scale (8)", status="failed", bs=8, seed=0, method="fixed")
    T(trial_id="r5-s0", row=5, label="loss scale (128)", status="running", bs=8, seed=0, method="fixed")
    for seed, m in ((0, 0.7800), (1, 0.7820)):
        T(trial_id=f"r6-s{seed}", row=6, label="loss scale (dynamic, interval=10)", status="finished",
          bs=8, seed=seed, method="dynamic", final_map=m)
    T(trial_id="r6-s2", row=6, label="loss scale (dynamic, interval=10)", status="diverged", bs=8,
      seed=2, method="dynamic", diverged_step=300)
    # batch 32 (inserted out of row order on purpose)
    T(trial_id="b32-r5", row=5, label="loss scale (128)", status="finished", bs=32, seed=0,
      method="fixed", final_map=0.8001)
    T(trial_id="b32-r1", row=1, label="adaptive", status="finished", bs=32, seed=0, final_map=0.8030)
    T(trial_id="b32-r3", row=3, label="no loss scale", status="diverged", bs=32, seed=0, method="fixed")

    exp2 = client.create_experiment(OTHER)
    parent2 = client.create_run(exp2, tags={"lsbench.role": "study", "lsbench.study": OTHER}).info.run_id
    _add_trial(client, exp2, parent2, OTHER, trial_id="t0", row=0, label="x", label_tag=False,
               status="finished", bs=4, seed=0, model="ssd_tiny", precision="mixed16", method="fixed",
               extra_params={"scaling.scale": "128"}, final_map=0.25, eval_metric="coco")
    _add_trial(client, exp2, parent2, OTHER, trial_id="t1", row=1, label="adaptive", status="finished",
               bs=4, seed=0, model="ssd_tiny", precision="mixed16", final_map=0.27, eval_metric="coco")
    return uri


@pytest.fixture(scope="module")
def runs(store):
    return load_runs(store, STUDY)


def test_load_runs_one_row_per_trial(runs):
    assert runs["study"].eq(STUDY).all()
    assert len(runs) == 13  # 14 trial runs, one trial_id twice; parent run excluded
    assert runs["trial_id"].is_unique
    for c in ("study", "trial_id", "run_id", "status", "label", "row", "model", "batch_size", "seed",
              "precision", "method", "final_map", "final_map_50", "best_map", "diverged_step", "eval_metric"):
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
    assert dyn["cell"] == "78.10 ± 0.14 (1/3 diverged)"
    adaptive = s[(s["batch_size"] == 8) & (s["row"] == 1)].iloc[0]
    assert adaptive["n_runs"] == 1 and adaptive["best"]  # duplicate run counted once
    assert s["best"].sum() == 2  # one per table


def test_markdown_exact(runs):
    lines = render(runs, "markdown").splitlines()
    i = lines.index(f"### {STUDY}: SSD512 batch 8")
    assert lines[i + 1: i + 12] == [
        "",
        "| Model  | Loss scale                          | Batch size | Validation mAP              |",
        "| ------ | ----------------------------------- | ---------- | --------------------------- |",
        "| SSD512 | FP32 baseline                       | 8          | 78.97 ± 0.04 (n=2)          |",
        "| SSD512 | adaptive †                          | 8          | **79.27**                   |",
        "| SSD512 | adaptive (freq=10) †                | 8          | 79.24                       |",
        "| SSD512 | no loss scale †                     | 8          | diverged                    |",
        "| SSD512 | loss scale (8) †                    | 8          | failed                      |",
        "| SSD512 | loss scale (128) †                  | 8          | –                           |",
        "| SSD512 | loss scale (dynamic, interval=10) † | 8          | 78.10 ± 0.14 (1/3 diverged) |",
        "",
    ]
    j = lines.index(f"### {STUDY}: SSD512 batch 32")
    assert j > i
    assert lines[j + 1: j + 8] == [
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
    assert lines[j + 8:] == [
        "Metric: VOC07 11-point mAP (`final_map`, %). Several seeds: mean ± sample std; best per table in bold.",
        "",
        "Trials: 13 (8 finished, 3 diverged, 1 failed, 1 running).",
        "",
        "† fp16-emulated: these numbers come from the CPU fp16 emulation (compute in fp32, "
        "fp16 rounding of layer outputs and gradients), not real fp16.",
    ]


def test_no_emulation_note_without_emulated_runs(store):
    md = render(load_runs(store, OTHER), "markdown")
    assert "†" not in md and "emulation" not in md
    assert "Metric: COCO mAP@[.5:.95] (`final_map`, %)." in md
    assert "| SSD-tiny | loss scale (128) | 4          | 25.00          |" in md.splitlines()
    md50 = render(load_runs(store, OTHER), "markdown", metric="final_map_50")
    assert "Metric: COCO mAP@0.5 (`final_map_50`, %)." in md50
    assert "**37.00**" in md50


def test_csv_parse_back(runs):
    text = render(runs, "csv")
    back = pd.read_csv(io.StringIO(text))
    assert list(back.columns) == report.SUMMARY_COLUMNS
    assert len(back) == 10  # 7 rows at batch 8, 3 at batch 32
    row = back[(back["batch_size"] == 8) & (back["row"] == 0)].iloc[0]
    assert row["mean"] == pytest.approx(0.7897) and row["cell"] == "78.97 ± 0.04 (n=2)"
    assert back.loc[back["best"], "cell"].tolist() == ["79.27", "80.30"]
    assert back[back["row"] == 3]["cell"].eq("diverged").all()


def test_latex_escaping(runs):
    tex = render(runs, "latex")
    assert r"\begin{tabular}{llrl}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert tex.count(r"\begin{tabular}") == 2
    assert r"SSD512 & FP32 baseline & 8 & 78.97 $\pm$ 0.04 (n=2) \\" in tex
    assert r"SSD512 & adaptive$^\dagger$ & 8 & \textbf{79.27} \\" in tex
    assert r"\caption{ssd512\_emu: SSD512 batch 8}" in tex
    assert r"\texttt{final\_map}, \%" in tex
    assert "±" not in tex and "–" not in tex
    assert report.latex_escape("a_b 50% & c") == r"a\_b 50\% \& c"


def test_html_contains_tables_and_images(runs):
    page = render(runs, "html", images={"loss_scale": b"\x89PNG fake"})
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<table>") == 2
    assert "<th>Validation mAP</th>" in page
    assert '<td class="num"><strong>79.27</strong></td>' in page
    assert "78.10 ± 0.14 (1/3 diverged)" in page
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
    assert s.loc["a", "cell"] == "50.00 ± 0.00" and s.loc["a", "best"]
    assert s.loc["b", "cell"] == "40.00 (n=1)"
    assert s.loc["c", "cell"] == "– (1/2 diverged)"
    assert s.loc["d", "cell"] == "–"  # finished but no metric logged
    assert s.loc["e", "cell"] == "– (1/2 failed)"  # pending reads as not done yet
    md = render(pd.DataFrame(rows), "markdown")
    assert "Trials: 9 (5 finished, 1 diverged, 1 failed, 1 running, 1 pending)." in md.splitlines()
    # a single value is not bolded: nothing to compare with
    one = summarize(pd.DataFrame(rows[2:3]))
    assert not one["best"].any()

