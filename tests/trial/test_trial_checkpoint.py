"""The checkpoint pieces alone: the trainer and its hooks round-trip their state, a foreign
checkpoint is refused, a checkpoint from before hooks had state still resumes its best mAP."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossscale_bench.backends import get_backend
from lossscale_bench.engine import EvalHook, Trainer
from lossscale_bench.engine.schedule import build_optimizer, build_scheduler
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.precision import get_precision
from lossscale_bench.scaling import build_scaler
from lossscale_bench.trial import CheckpointError
from lossscale_bench.trial.checkpoint import capture, resume

SCHED = {"iterations": 10, "lr": 0.1, "warmup_iterations": 2, "momentum": 0.9, "weight_decay": 0.0}


def _trainer(seed: int, scale: float):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = build_optimizer(model, SCHED, {})
    hook = EvalHook(MemorySink(), lambda: {"map": 0.0, "map_50": 0.0}, None)
    scaler = build_scaler({"method": "dynamic", "style": "torch", "init_scale": scale})
    return Trainer(
        model=model,
        optimizer=opt,
        scheduler=build_scheduler(opt, SCHED),
        scaler=scaler,
        backend=get_backend("cpu"),
        precision=get_precision("fp32"),
        iterations=10,
        hooks=[hook],
    ), hook


def test_trainer_state_round_trips_through_a_checkpoint(tmp_path):
    a, hook_a = _trainer(0, 1024.0)
    a.state.step, a.state.skipped_steps, hook_a.best_map = 7, 2, 0.42
    a.optimizer.step()  # some optimizer state
    torch.save(capture(a, "t1", hook_a.best_map), tmp_path / "c.pt")
    b, hook_b = _trainer(1, 8.0)
    assert resume(b, tmp_path / "c.pt", "t1") is not None
    assert (b.state.step, b.state.skipped_steps, hook_b.best_map) == (7, 2, 0.42)
    assert b.scaler.current_scale() == 1024.0
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_foreign_checkpoint_is_refused(tmp_path):
    a, hook = _trainer(0, 1.0)
    torch.save(capture(a, "other", hook.best_map), tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="belongs to trial other"):
        resume(_trainer(0, 1.0)[0], tmp_path / "c.pt", "mine")


def test_no_checkpoint_is_a_fresh_start(tmp_path):
    assert resume(_trainer(0, 1.0)[0], tmp_path / "none.pt", "t") is None


def test_checkpoint_written_before_hook_state_keeps_best_map(tmp_path):
    a, hook = _trainer(0, 1.0)
    ck = capture(a, "t", 0.0)
    del ck["hooks"]
    ck["best_map"] = 0.31
    torch.save(ck, tmp_path / "old.pt")
    b, hook_b = _trainer(0, 1.0)
    resume(b, tmp_path / "old.pt", "t")
    assert hook_b.best_map == 0.31
