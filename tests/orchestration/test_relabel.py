"""A label edited after a run: the finished trial is not run again, its stored run takes the new label,
``run`` says so, and the report prints the new label with the same number."""

from __future__ import annotations

import io

from helpers import write_study
from lossscale_bench.orchestration import run_study
from lossscale_bench.report.runs import load_runs
from lossscale_bench.study import load_study


def test_edited_label_renames_the_stored_rows_and_is_announced(tmp_path):
    runs = tmp_path / "runs"
    first = load_study(write_study(tmp_path, "a.yaml", scaling=["{method: none, label: old name}"]))
    run_study(first, runs_dir=runs, executor="local", quiet=True)
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    before = load_runs(uri, study="t")
    second = load_study(write_study(tmp_path, "b.yaml", scaling=["{method: none, label: new name}"]))
    assert [t.trial_id for t in second.trials()] == [t.trial_id for t in first.trials()]
    said = io.StringIO()
    result = run_study(
        second, runs_dir=runs, executor="local", stream=said, quiet=True
    )  # quiet hides progress, not this
    assert result.skipped == [first.trials()[0].trial_id]  # not trained again
    assert "'old name' -> 'new name'" in said.getvalue()
    after = load_runs(uri, study="t")
    assert list(before["label"]) == ["old name"] and list(after["label"]) == ["new name"]
    assert list(after["final_map"]) == list(before["final_map"])
    assert after["run_name"].iloc[0].startswith("new name | ")
