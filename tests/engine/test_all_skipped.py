"""A run that skipped every step trained nothing: it ends ``diverged`` with the reason, not ``finished``
(before: a fixed scale far past what fp16 gradients carry overflowed on every step and, shorter than
``divergence.max_consecutive_skips``, was reported as a finished row of initial weights)."""

from __future__ import annotations

import json

import pytest
import torch
from test_scale_collapse import _AlwaysOverflows, _batches

from helpers import lsbench, write_study
from lossscale_bench.backends import get_backend
from lossscale_bench.engine import DivergenceHook, MetricsHook, Trainer, TrialDiverged
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.precision import get_precision
from lossscale_bench.scaling import build_scaler


def test_a_run_whose_every_step_was_skipped_is_diverged_through_the_cli(tmp_path):
    study = write_study(
        tmp_path,
        name="skips",
        precision="fp16-emulated",
        scaling=["{method: fixed, scale: 1.0e+30}", "{method: fixed, scale: 128}"],
        schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 1},
    )
    r = lsbench("run", study, "--executor", "local", "--runs-dir", tmp_path / "runs", "--no-report", cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "study t: 1 finished, 1 diverged, 0 failed" in r.stdout, r.stdout[-3000:]
    (line,) = [x for x in r.stdout.splitlines() if "fixed1e_30" in x and "diverged at step" in x]
    assert line.split("]", 1)[1].startswith(" diverged loss scale (1e+30)") and line.endswith("diverged at step 1")
    (outcome,) = (
        json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("outcome.json") if "fixed1e_30" in str(p)
    )
    assert (outcome["status"], outcome["steps"], outcome["skipped_steps"]) == ("diverged", 4, 4)
    assert outcome["diverged_reason"] == (
        "every step skipped on overflow (4 of 4; no update was applied) at loss scale 1e+30"
    )
    assert "Traceback" not in r.stderr


def _trainer(sink, policy, iterations, skips=10_000):
    model = _AlwaysOverflows()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    div = DivergenceHook(sink, patience=10, max_consecutive_skips=skips, policy=policy, check_every=10)
    scaler = build_scaler({"method": "fixed", "scale": 8.0})  # skips every step, and never collapses
    return Trainer(
        model=model,
        optimizer=opt,
        scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0),
        scaler=scaler,
        backend=get_backend("cpu"),
        precision=get_precision("fp32"),
        batches=_batches(),
        iterations=iterations,
        hooks=[MetricsHook(sink, 10), div],
        sync_every=10,
    ), div


@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_every_step_skipped_is_a_divergence_from_step_1(policy):
    sink = MemorySink()
    tr, div = _trainer(sink, policy, iterations=25)
    if policy == "stop":
        with pytest.raises(TrialDiverged):
            tr.run()
    else:
        tr.run()
    assert div.diverged is not None and div.diverged.step == 1
    assert div.diverged.reason == "every step skipped on overflow (25 of 25; no update was applied) at loss scale 8"
    assert sink.tag_values["lsbench.diverged_reason"] == div.diverged.reason


def test_a_resumed_run_counts_the_steps_it_skipped_before():
    """The judgement reads the trainer's counts, which a resume restores: 10 skipped steps before
    the checkpoint and 5 after are 15 of 15."""
    sink = MemorySink()
    tr, div = _trainer(sink, "stop", iterations=15)
    tr.state.step = tr.state.skipped_steps = 10
    with pytest.raises(TrialDiverged):
        tr.run()
    assert "(15 of 15;" in div.diverged.reason
    tr, div = _trainer(MemorySink(), "stop", iterations=15)
    tr.state.step, tr.state.skipped_steps = 10, 9  # one step before the checkpoint trained
    tr.run()
    assert div.diverged is None
