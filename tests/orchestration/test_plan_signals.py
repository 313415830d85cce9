"""Ctrl-C between two rounds of a seed plan: the study's parent run ends KILLED (interrupted), not FINISHED with
pairs still open, and the same command continues the plan.

The signal is sent from inside the look at the store that follows the first round (``seed_rounds.look_at_store``,
wrapped): no runner is active then, which is where it used to fall to Python's default handler after the round
had already ended the parent run FINISHED.
"""

from __future__ import annotations

import os
import signal

import pytest
from test_seed_rounds import ROUNDS


def _parent(uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("rounds")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'study'")
    trials = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    return parent, trials


@pytest.mark.slow
def test_ctrl_c_between_rounds_ends_the_parent_killed_and_the_rerun_continues(tmp_path, monkeypatch, capsys):
    import lossscale_bench.seed_rounds as seed_rounds
    from lossscale_bench.cli import main
    from lossscale_bench.study import load_study

    path = tmp_path / "rounds.yaml"
    path.write_text(ROUNDS)
    runs = tmp_path / "runs"
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    args = ["run", str(path), "--runs-dir", str(runs), "--executor", "local", "--no-report", "--quiet"]
    real_look, looks = seed_rounds.look_at_store, []

    def look_then_ctrl_c(*a, **k):
        out = real_look(*a, **k)
        looks.append(1)
        if len(looks) == 1:  # the look after the first round (a new store has no look before it)
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(seed_rounds, "look_at_store", look_then_ctrl_c)
    assert main(args) == 130
    assert "interrupted by SIGINT" in capsys.readouterr().err
    parent, trials = _parent(uri)
    assert (parent.info.status, parent.data.tags["lsbench.status"]) == ("KILLED", "interrupted")
    assert len(trials) == 4 and {t.info.status for t in trials} <= {"FINISHED", "FAILED"}

    monkeypatch.setattr(seed_rounds, "look_at_store", real_look)
    assert main(args) in (0, 3)
    parent, trials = _parent(uri)
    assert parent.info.status in ("FINISHED", "FAILED") and parent.data.tags["lsbench.status"] in ("finished", "failed")
    assert not [t for t in trials if t.info.status == "RUNNING"]
    decisions, _ = real_look(uri, load_study(path))
    assert not (decisions["outcome"] == "continue").any() or len(trials) == 8  # decided, or every row at max
