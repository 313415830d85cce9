"""``lsbench report --telemetry``: per-row flush/saturation/scale means read back from a real store."""

from __future__ import annotations

import pytest

from helpers import lsbench, study_yaml
from lossscale_bench.orchestration import run_study
from lossscale_bench.report.telemetry_summary import TELEMETRY_COLUMNS, render_telemetry_markdown, telemetry_rows
from lossscale_bench.study import load_study_text


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    runs = tmp_path_factory.mktemp("tele") / "runs"
    study = load_study_text(
        study_yaml(
            name="tele",
            precision="fp8-e4m3-emulated",
            seeds=[0, 1],
            log_every=2,
            scaling=["{method: none, label: unscaled}", "{method: fixed, scale: 128, label: x128}"],
        ),
        "tele.yaml",
    )
    run_study(study, runs_dir=runs, executor="local", quiet=True)
    return runs, f"sqlite:///{runs / 'mlflow.db'}"


def test_rows_are_the_means_of_the_logged_histories(store):
    from mlflow import MlflowClient

    from lossscale_bench.report import load_runs

    _, uri = store
    df = telemetry_rows(uri, "tele").set_index("label")
    assert sorted(df.index) == ["unscaled", "x128"] and list(df["n"]) == [2, 2]
    assert df.loc["x128", "loss scale, first"] == 128 and df.loc["unscaled", "loss scale, last"] == 1
    assert df.loc["unscaled", "skipped steps"] == 0
    client = MlflowClient(tracking_uri=uri)
    runs = load_runs(uri, "tele")
    for label in ("unscaled", "x128"):  # the same number computed here, from the raw histories
        per_run = []
        for rid in runs[runs["label"] == label]["run_id"]:
            hist = [m.value for m in client.get_metric_history(rid, "param_saturate_rate_mean")]
            assert hist, "the trial logged parameter-gradient saturation"
            per_run.append(sum(hist) / len(hist))
        assert df.loc[label, "saturated (param. grads)"] == pytest.approx(sum(per_run) / len(per_run))
    text = render_telemetry_markdown(telemetry_rows(uri, "tele"))
    assert text.splitlines()[0].count("|") == len(TELEMETRY_COLUMNS) + 4 and "| x128 |" in text


def test_cli_prints_it_and_refuses_other_formats(store):
    runs, _ = store
    r = lsbench("report", "--runs-dir", runs, "--study", "tele", "--telemetry")
    assert r.returncode == 0 and "| unscaled | fp8-e4m3-emulated | 2 |" in r.stdout, r.stderr[-2000:]
    r = lsbench("report", "--runs-dir", runs, "--study", "tele", "--telemetry", "--format", "csv")
    assert r.returncode == 2
    assert r.stderr.strip() == "lsbench: error: --telemetry: the telemetry table is markdown only; drop --format csv"


def test_cli_out_naming_another_format_says_so(store, tmp_path):
    runs, _ = store
    # no --format given: the .csv of --out said it, and "drop --format" pointed at nothing to drop
    r = lsbench("report", "--runs-dir", runs, "--study", "tele", "--telemetry", "--out", str(tmp_path / "t.csv"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        f"lsbench: error: --telemetry: the telemetry table is markdown only; --out "
        f"{tmp_path / 't.csv'} names a csv file: give an --out ending in .md, a folder, or -"
    )


def test_cli_out_to_a_place_it_cannot_write_is_one_line(store, tmp_path):
    runs, _ = store
    # a parent that is a file: one line naming the path, exit 2, as the tables' report (a traceback before)
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile" / "t.md", f"{tmp_path / 'afile' / 'sub'}/"):
        r = lsbench("report", "--runs-dir", runs, "--study", "tele", "--telemetry", "--out", str(out))
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert r.stderr.startswith(f"lsbench: error: cannot write report to {tmp_path / 'afile'}")
    # a folder: <study>_telemetry.md inside it, its path printed
    r = lsbench("report", "--runs-dir", runs, "--study", "tele", "--telemetry", "--out", f"{tmp_path / 'd'}/")
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "d" / "tele_telemetry.md")
    assert "| x128 |" in (tmp_path / "d" / "tele_telemetry.md").read_text(encoding="utf-8")


def test_cli_telemetry_refuses_metric_and_margin(store):
    runs, _ = store
    # --metric and --margin say nothing about the telemetry table: refused, not silently ignored
    for flags, named in (
        (("--metric", "best_map"), "--metric would change nothing in it; drop it"),
        (("--margin", "2"), "--margin would change nothing in it; drop it"),
        (("--metric", "best_map", "--margin", "2"), "--metric and --margin would change nothing in it; drop them"),
    ):
        r = lsbench("report", "--runs-dir", runs, "--study", "tele", "--telemetry", "--out", "-", *flags)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.strip() == (
            f"lsbench: error: --telemetry: the telemetry table has no mAP column and no "
            f"verdicts, so {named}, or leave out --telemetry for the mAP tables"
        )


def test_a_step_logged_twice_counts_once():
    """Stores written before reruns kept repeated steps out hold a failed attempt's steps after its
    checkpoint twice; the mean over the history counts each step once (its last point)."""
    from mlflow.entities import Metric

    from lossscale_bench.report.telemetry_summary import _reduce

    first = [Metric("flush_rate_mean", 0.1, 1000 + s, s) for s in range(1, 31)]
    rerun = [Metric("flush_rate_mean", 0.1 if s <= 30 else 0.4, 5000 + s, s) for s in range(21, 41)]
    assert _reduce(first + rerun, "mean") == pytest.approx((30 * 0.1 + 10 * 0.4) / 40)
    assert _reduce(first + rerun, "last") == 0.4 and _reduce(rerun + first, "first") == 0.1


def test_a_new_per_layer_method_shows_its_layer_scales_without_a_report_edit(store):
    """The column reads any metric ending in ``scale_log2_median`` (the report used to name the three
    per-layer methods' metrics by hand, so a fourth showed '–')."""
    from mlflow import MlflowClient

    from lossscale_bench.report import load_runs

    _, uri = store
    client = MlflowClient(tracking_uri=uri)
    for rid in load_runs(uri, "tele").query("label == 'x128'")["run_id"]:
        client.log_metric(rid, "madeup_point_scale_log2_median", 5.0, step=1)
        client.log_metric(rid, "madeup_point_scale_log2_median", 7.0, step=2)
    df = telemetry_rows(uri, "tele").set_index("label")
    assert df.loc["x128", "layer scale log2, median (last)"] == 7.0
    assert (
        df.loc["unscaled", "layer scale log2, median (last)"] != df.loc["unscaled", "layer scale log2, median (last)"]
    )
