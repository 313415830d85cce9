"""Plots: each function on data or on a real SQLite MLflow store with artifacts;
the markdown/html reports with their plots."""

from __future__ import annotations

import io
import math
import sys

import pandas as pd
import pytest
from plot_store import FIELDS, LAYERS, OTHER, STUDY, png_size, shared_store, write_layers_csv

from lossscale_bench.report import ReportError, draw, figure, heatmap, load_runs, plots, render, summarize, write_report


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return shared_store(tmp_path_factory)


@pytest.fixture(scope="module")
def study_plots(store):
    return {p.name: p for p in plots.study_plots(store, STUDY)}


@pytest.fixture
def reuse_plots(store, study_plots, monkeypatch):
    """write_report(study=STUDY) gets the plots drawn once above (they are checked there)."""
    real = plots.study_plots

    def cached(uri, study=None, **kw):
        if (uri, study, kw.get("metric", "final_map")) == (store, STUDY, "final_map"):
            return list(study_plots.values())
        return real(uri, study, **kw)

    monkeypatch.setattr(plots, "study_plots", cached)


def _pixels(png: bytes):
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(png), format="png")


def _is_png(png, min_w=300, min_h=200, max_side=4000) -> tuple[int, int]:
    w, h = png_size(png)
    assert min_w <= w <= max_side and min_h <= h <= max_side, (w, h)
    img = _pixels(png)
    assert img.shape[:2] == (h, w)
    assert img[..., :3].std() > 0.05  # not a blank canvas
    return w, h


def test_curves_png_seeds_mean_and_nonfinite():
    seeds = [[(s, 5.0 - 0.1 * s + k) for s in range(30)] for k in (0.0, 0.2)]
    diverged = [(s, 5.0 - 0.1 * s) for s in range(10)] + [(10, math.nan), (11, math.inf)]
    png = draw.curves_png(
        {
            "SSD-tiny batch 4": {"adaptive": seeds, "no loss scale": [diverged]},
            "SSD300 batch 8": {"adaptive": [seeds[0]]},
        },
        ylabel="loss",
        title="t",
    )
    w, h = _is_png(png)
    assert w > h  # two panels side by side
    long = [(s, 1.0 + (s % 7) / 10) for s in range(5000)]  # smoothed, subsampled
    _is_png(draw.curves_png({"": {"x": [long]}}, ylabel="loss"))
    # a log2 axis drops non-positive values; nothing drawable -> None
    _is_png(
        draw.curves_png({"": {"fixed": [[(0, 128.0), (5, 128.0)]], "zero": [[(0, 0.0)]]}}, ylabel="scale", log2=True)
    )
    assert draw.curves_png({"": {"x": [[(0, math.nan)], []]}}, ylabel="loss") is None
    assert draw.curves_png({}, ylabel="loss") is None


def test_map_bars_marks_diverged_failed_running():
    base = dict(study="s", model="ssd_tiny", batch_size=4, precision="mixed16", eval_metric="voc07")
    rows = [
        dict(base, trial_id=f"a{i}", row=0, label="adaptive", seed=i, status="finished", final_map=0.3 + i / 100)
        for i in range(3)
    ]
    rows += [
        dict(base, trial_id="d0", row=1, label="no loss scale", seed=0, status="diverged", final_map=None),
        dict(base, trial_id="f0", row=2, label="loss scale (8)", seed=0, status="failed", final_map=None),
        dict(base, trial_id="r0", row=3, label="loss scale (128)", seed=0, status="running", final_map=None),
        dict(base, trial_id="p0", row=4, label="dynamic", seed=0, status="finished", final_map=0.2),
        dict(base, trial_id="p1", row=4, label="dynamic", seed=1, status="diverged", final_map=None),
    ]
    s = summarize(pd.DataFrame(rows))
    _is_png(draw.map_bars_png(s, title="mAP"))
    assert draw.map_bars_png(s.iloc[0:0]) is None


def test_layer_heatmaps_from_csv(tmp_path):
    plain = heatmap.read_layers_csv(write_layers_csv(tmp_path / "p.csv", adaptive=False))
    ada = heatmap.read_layers_csv(write_layers_csv(tmp_path / "a.csv", adaptive=True))
    assert set(plain["layer"]) == set(LAYERS) and plain["scale"].isna().all()
    _is_png(heatmap.layer_heatmap_png(plain, ("underflow_rate",), title="u"), min_h=250)
    w, _ = _is_png(heatmap.layer_heatmap_png(ada, ("scale", "accum_scale"), log2=True), min_h=250)
    assert w > 1000  # two panels
    assert heatmap.layer_heatmap_png(plain, ("scale", "accum_scale"), log2=True) is None  # no adaptive scales
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a layers history"):
        heatmap.read_layers_csv(tmp_path / "bad.csv")


def test_layers_csv_matches_telemetry(tmp_path):
    """The test CSVs have the columns the trial's LayerHistory writes (blank scales for non-adaptive)."""
    from lossscale_bench.precision.telemetry import LayerHistory

    assert LayerHistory.FIELDS == FIELDS
    h = LayerHistory(tmp_path / "layers_history.csv")
    h.append(0, {"conv1": {"underflow_rate": 0.5, "flush_rate": 0.1, "nonzero": 10}}, [])
    h.append(
        5,
        {"conv1": {"underflow_rate": 0.25, "flush_rate": 0.0, "nonzero": 10}},
        [{"layer": "conv1", "scale": 4.0, "accum_scale": 4.0}],
    )
    t = heatmap.read_layers_csv(h.path)
    assert t["step"].tolist() == [0, 5] and math.isnan(t["scale"][0]) and t["scale"][1] == 4.0
    _is_png(heatmap.layer_heatmap_png(t, ("underflow_rate",)), min_h=150)


def test_trial_plots_files(tmp_path):
    had_pyplot = "matplotlib.pyplot" in sys.modules
    metrics = {
        "loss": [(s, 5.0 - s / 10) for s in range(40)] + [(40, math.nan)],
        "loss_scale": [(s, 2.0 ** (16 - s // 10)) for s in range(40)],
        "lr": [(0, 0.1)],
    }
    out = plots.trial_plots(metrics, write_layers_csv(tmp_path / "a.csv", adaptive=True), tmp_path / "plots")
    assert [p.name for p in out] == ["loss.png", "loss_scale.png", "underflow_heatmap.png", "scale_heatmap.png"]
    for p in out:
        assert p.parent == tmp_path / "plots"
        _is_png(p.read_bytes(), min_h=250)
    out = plots.trial_plots(metrics, write_layers_csv(tmp_path / "p.csv", adaptive=False), tmp_path / "p")
    assert [p.name for p in out] == ["loss.png", "loss_scale.png", "underflow_heatmap.png"]
    # no CSV (telemetry off, or a trial that died before its first logged step), no loss scale
    out = plots.trial_plots({"loss": metrics["loss"]}, tmp_path / "missing.csv", tmp_path / "n")
    assert [p.name for p in out] == ["loss.png"]
    assert plots.trial_plots({}, None, tmp_path / "e") == [] and not (tmp_path / "e").exists()
    if not had_pyplot:
        assert "matplotlib.pyplot" not in sys.modules  # no pyplot: no global figure state


def test_study_plots_from_mlflow(study_plots):
    assert list(study_plots) == [
        "loss",
        "loss_scale",
        "map",
        "underflow_adaptive",
        "scale_adaptive",  # seed 0 of adaptive has the artifact
        "underflow_no_loss_scale",  # a diverged trial's heatmap up to its divergence
    ]  # the other rows have no layers artifact (as when a trial failed before its first logged step)
    for p in study_plots.values():
        _is_png(p.png)
        assert p.title.startswith(f"{STUDY}: ")
    assert "seed 0" in study_plots["scale_adaptive"].title


def test_study_plots_limits_and_all_studies(store):
    few = plots.study_plots(store, STUDY, max_layer_runs=0, seeds_per_label=1, max_curve_runs=2)
    assert [p.name for p in few] == ["loss", "loss_scale", "map"]
    every = [p.name for p in plots.study_plots(store, None, max_layer_runs=1)]
    assert every == [
        f"{STUDY}_loss",
        f"{STUDY}_loss_scale",
        f"{STUDY}_map",
        f"{OTHER}_loss",
        f"{OTHER}_loss_scale",
        f"{OTHER}_map",
        f"{OTHER}_underflow_adaptive",
        f"{OTHER}_scale_adaptive",
    ]  # FP32 baseline (row 0) has no CSV


def test_markdown_report_links_pngs_beside_it(store, reuse_plots, tmp_path):
    text, path = write_report(store, study=STUDY, reports_dir=tmp_path)
    assert path == tmp_path / f"{STUDY}.md"
    assert text.startswith(render(load_runs(store, STUDY), "markdown"))  # tables unchanged, plots after
    lines = text.splitlines()
    i = lines.index("## Plots")
    links = [ln for ln in lines[i:] if ln.startswith("![")]
    assert links[0] == f"![{STUDY}: loss curves per scaling method]({STUDY}_loss.png)"
    assert len(links) == 6
    for ln in links:
        fname = ln[ln.index("](") + 2 : -1]
        _is_png((tmp_path / fname).read_bytes())
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(ln[ln.index("](") + 2 : -1] for ln in links)

    bare = tmp_path / "bare"
    text, path = write_report(store, study=STUDY, reports_dir=bare, plots=False)
    assert "## Plots" not in text and list(bare.iterdir()) == [path]


def test_out_folder_writes_inside_it_and_out_dash_writes_nothing(store, reuse_plots, tmp_path, monkeypatch):
    """``--out DIR`` used to write ``DIR_*.png`` into the working directory; ``--out -`` a file named '-'."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "out"
    folder.mkdir()
    text, path = write_report(store, study=STUDY, out=folder)
    assert path == folder / f"{STUDY}.md" and path.read_text() == text
    assert len(list(folder.glob("*.png"))) == 6 and not list(tmp_path.glob("*.png"))
    text, path = write_report(store, study=STUDY, out="new/")  # a trailing slash names a folder to make
    assert path.resolve() == tmp_path / "new" / f"{STUDY}.md" and path.exists()
    for fmt in ("markdown", "html"):
        text, path = write_report(store, study=STUDY, out="-", fmt=fmt)
        assert path is None and not (tmp_path / "-").exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "out"]
    assert "## Plots" not in write_report(store, study=STUDY, out="-")[0]  # its plots would be files


def test_html_report_embeds_plots_csv_latex_unchanged(store, reuse_plots, study_plots, tmp_path):
    text, path = write_report(store, study=STUDY, fmt="html", reports_dir=tmp_path)
    assert path.suffix == ".html" and list(tmp_path.iterdir()) == [path]  # one self-contained file
    assert text.count('src="data:image/png;base64,') == 6
    assert text.index("<h2>Plots</h2>") > text.rindex("</table>")
    assert f"<figcaption>{study_plots['map'].title}</figcaption>" in text
    assert "http" not in text.replace('lang="en"', "")
    text, _ = write_report(store, study=STUDY, fmt="html", reports_dir=tmp_path, plots=False)
    assert "data:image/png" not in text and "Plots" not in text
    runs = load_runs(store, STUDY)
    for fmt in ("csv", "latex"):
        text, p = write_report(store, study=STUDY, fmt=fmt, reports_dir=tmp_path / fmt)
        assert text == render(runs, fmt) and list((tmp_path / fmt).iterdir()) == [p]


def test_plot_failure_is_one_line_report_error(store, tmp_path, monkeypatch):
    def broken(*a, **k):
        raise figure.PlotError("matplotlib is not installed (No module named 'matplotlib')")

    monkeypatch.setattr(plots, "study_plots", broken)
    with pytest.raises(ReportError, match=r"cannot draw the report's plots: PlotError: .*--no-plots") as e:
        write_report(store, study=STUDY, fmt="html", reports_dir=tmp_path)
    assert "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())  # nothing half-written
    write_report(store, study=STUDY, fmt="html", reports_dir=tmp_path, plots=False)


def test_same_label_in_two_precisions_is_two_lines():
    runs = pd.DataFrame(
        {"label": ["adaptive", "adaptive", "FP32 baseline", None], "precision": ["mixed16", "bf16", "fp32", "fp32"]}
    )
    assert plots._display_labels(runs)["label"].tolist() == [
        "adaptive [mixed16]",
        "adaptive [bf16]",
        "FP32 baseline",
        "?",
    ]


def test_run_plots_from_the_store_logged_as_artifacts(store, tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store)
    runs = load_runs(store, STUDY).set_index("trial_id")
    rid = runs.loc["r1-s1", "run_id"]  # adaptive seed 1: histories, no layers artifact
    paths = plots.run_plots(client, rid, tmp_path / "r1-s1")
    assert [p.name for p in paths] == ["loss.png", "loss_scale.png"]
    assert sorted(a.path for a in client.list_artifacts(rid, "plots")) == ["plots/loss.png", "plots/loss_scale.png"]
    rid = runs.loc["r3-s0", "run_id"]  # diverged at step 12, with its layers CSV
    paths = plots.run_plots(store, rid, tmp_path / "r3-s0", log=False)
    assert [p.name for p in paths] == ["loss.png", "loss_scale.png", "underflow_heatmap.png"]
    assert client.list_artifacts(rid, "plots") == []
