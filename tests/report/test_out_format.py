"""``report --format`` and ``--out``'s extension: they agree, or the tool says so in one line.

Through the real CLI on a real SQLite MLflow store filled the way trials fill it (``plot_store._trial``).
"""

from __future__ import annotations

import pytest
from plot_store import _trial

from helpers import lsbench
from lossscale_bench.report.out_format import resolve_format


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("out-format")
    uri = f"sqlite:///{root.resolve()}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("fmt", artifact_location=(root / "artifacts").resolve().as_uri())
    parent = client.create_run(exp, tags={"lsbench.role": "study", "lsbench.study": "fmt"}).info.run_id
    for seed, m in ((0, 0.30), (1, 0.31)):
        _trial(
            client,
            exp,
            parent,
            "fmt",
            root / "csv",
            trial_id=f"r0-s{seed}",
            row=0,
            label="FP32 baseline",
            status="finished",
            seed=seed,
            method="none",
            precision="fp32",
            final_map=m,
        )
    return uri


def test_a_contradicting_extension_is_refused_in_one_line(store, tmp_path):
    p = lsbench("report", "--tracking-uri", store, "--format", "html", "--out", tmp_path / "x.md", "--no-plots")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "x.md" in lines[0] and "--format markdown" in lines[0] and ".html" in lines[0], lines
    assert not (tmp_path / "x.md").exists()


def test_the_extension_names_the_format_when_format_is_not_given(store, tmp_path):
    p = lsbench("report", "--tracking-uri", store, "--out", tmp_path / "table.html", "--no-plots")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "table.html").read_text().lstrip().lower().startswith("<!doctype html")
    p = lsbench("report", "--tracking-uri", store, "--out", tmp_path / "table.tex", "--no-plots")
    assert p.returncode == 0, p.stderr
    assert r"\begin{tabular}" in (tmp_path / "table.tex").read_text()


def test_resolve_format():
    assert resolve_format(None, None) == "markdown"
    assert resolve_format(None, "-") == "markdown"
    assert resolve_format(None, "r.CSV") == "csv"
    assert resolve_format("markdown", "notes.txt") == "markdown"  # an unknown extension is taken as written
    assert resolve_format("latex", "t.tex") == "latex"
    with pytest.raises(ValueError, match="--format latex"):
        resolve_format("csv", "t.tex")


def test_a_study_file_reports_only_its_own_trials(store, tmp_path):
    """``lsbench report FILE`` passes the file's trial ids: a store's extra trials of the same study name
    (an earlier, longer seed list) stay out, so rows with the file's seeds are compared paired."""
    from lossscale_bench.report import write_report

    both, _ = write_report(store, study="fmt", fmt="csv", out="-", plots=False)
    one, _ = write_report(store, study="fmt", fmt="csv", out="-", plots=False, trial_ids={"r0-s0"})
    assert "30.50" in both, both  # the mean of seeds 0 and 1 (30 and 31)
    assert "30.00" in one and "30.50" not in one, one  # seed 0 alone
