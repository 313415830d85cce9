"""``dynamic`` with ``style: deepspeed`` against DeepSpeed's own update rule, step for step.

The reference is ``DynamicLossScaler.update_scale`` in DeepSpeed's
``deepspeed/runtime/fp16/loss_scaler.py`` (read at deepspeedai/DeepSpeed
edaa7221, 2026-08-22), transcribed below in plain Python: DeepSpeed itself is
not installed here (it pulls CUDA build machinery). The transcription keeps its
variable names and its order of operations, drops only the logging and the
exception it raises at ``min_scale`` (our scaler keeps skipping instead: the
divergence rule ends such a trial; tested separately below).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from lossscale_bench.scaling import DynamicLossScaler, build_scaler


class _DeepSpeedReference:
    """Transcription of deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler (update rule only)."""

    def __init__(self, init_scale, scale_window, min_scale, delayed_shift, consecutive_hysteresis):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis

    def update_scale(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1


def _through_checkpoint(state):
    """What trial.py does with a scaler's state: torch.save, then torch.load(weights_only=True)."""
    import io

    buf = io.BytesIO()
    torch.save({"scaler": state}, buf)
    buf.seek(0)
    return torch.load(buf, map_location="cpu", weights_only=True)["scaler"]


def _run_ours(scaler: DynamicLossScaler, pattern: list[bool]):
    """Drive the scaler through a real optimizer: (scale before each step, skipped, param unchanged)."""
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=0.1)
    out = []
    for overflow in pattern:
        scale = scaler.current_scale()
        before = p.detach().clone()
        p.grad = torch.full_like(p, math.inf if overflow else 1.0) * scale
        scaler.step(opt)
        res = scaler.last_step
        scaler.update()
        out.append((scale, res.skipped, torch.equal(before, p.detach())))
    return out


def _run_reference(ref: _DeepSpeedReference, pattern: list[bool]) -> list[float]:
    scales = []
    for overflow in pattern:
        scales.append(ref.cur_scale)
        ref.update_scale(overflow)
    return scales


PATTERNS = {
    # two overflows in a row: the first is absorbed by hysteresis 2, the second halves; growth after the window
    "hysteresis": [False] * 3 + [True, True] + [False] * 9 + [True] + [False] * 5 + [True, True, True],
    # the first growth needs window + 1 clean steps (DeepSpeed's off-by-one from last_overflow_iter = -1)
    "first-growth": [False] * 13,
    # down to min_scale and held there
    "floor": [True] * 30 + [False] * 8,
}


@pytest.mark.parametrize("consecutive", [False, True])
@pytest.mark.parametrize("name", sorted(PATTERNS) + ["random0", "random1", "random2"])
def test_matches_deepspeed_update_scale(name, consecutive):
    if name.startswith("random"):
        rng = random.Random(int(name[-1]))
        pattern = [rng.random() < 0.25 for _ in range(200)]
    else:
        pattern = PATTERNS[name]
    window, hyst, init, floor = 4, 3 if name.startswith("random") else 2, 2.0**10, 2.0**3
    ref = _DeepSpeedReference(init, window, floor, hyst, consecutive)
    ours = DynamicLossScaler(
        style="deepspeed",
        init_scale=init,
        interval=window,
        min_scale=floor,
        hysteresis=hyst,
        consecutive_hysteresis=consecutive,
    )
    expected = _run_reference(ref, pattern)
    got = _run_ours(ours, pattern)
    assert [g[0] for g in got] == expected
    # an overflow always skips the step, hysteresis or not; a clean step always runs
    assert [g[1] for g in got] == pattern
    assert [g[2] for g in got] == pattern
    assert ours.current_scale() == ref.cur_scale
    assert ours.state_dict()["cur_hysteresis"] == ref.cur_hysteresis


def test_deepspeed_defaults_and_hysteresis_story():
    s = DynamicLossScaler(style="deepspeed")
    assert (s.current_scale(), s.interval, s.hysteresis, s.min_scale, s.consecutive_hysteresis) == (
        65536.0,
        1000,
        2,
        1.0,
        False,
    )
    got = _run_ours(s, [True, True, True])
    # first overflow tolerated (scale kept), the second halves, the counter stays spent so the third halves too
    assert [g[0] for g in got] == [65536.0, 65536.0, 32768.0]
    assert s.current_scale() == 16384.0
    assert s.metrics() == {"loss_scale": 16384.0, "dyn_hysteresis_left": 1.0}


def test_deepspeed_at_min_scale_keeps_skipping_instead_of_raising():
    s = DynamicLossScaler(style="deepspeed", init_scale=4.0, min_scale=1.0, hysteresis=1)
    got = _run_ours(s, [True] * 6)
    assert [g[0] for g in got] == [4.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    assert all(g[1] for g in got)


def test_deepspeed_state_dict_continues_identically():
    rng = random.Random(7)
    pattern = [rng.random() < 0.3 for _ in range(80)]
    kw = dict(style="deepspeed", init_scale=2.0**12, interval=3, hysteresis=3)
    full = DynamicLossScaler(**kw)
    whole = _run_ours(full, pattern)
    first = DynamicLossScaler(**kw)
    _run_ours(first, pattern[:37])
    resumed = DynamicLossScaler(**kw)
    resumed.load_state_dict(_through_checkpoint(first.state_dict()))
    assert resumed.state_dict() == first.state_dict()
    assert _run_ours(resumed, pattern[37:]) == whole[37:]
    assert resumed.state_dict() == full.state_dict()


def test_build_and_reject():
    d = build_scaler(
        {
            "method": "dynamic",
            "style": "deepspeed",
            "interval": 1000,
            "init_scale": 65536.0,
            "hysteresis": 2,
            "min_scale": 1.0,
            "consecutive_hysteresis": False,
        }
    )
    assert (d.style, d.current_scale(), d.hysteresis) == ("deepspeed", 65536.0, 2)
    with pytest.raises(ValueError, match="hysteresis"):
        DynamicLossScaler(style="torch", hysteresis=2)
    with pytest.raises(ValueError, match="hysteresis must be >= 1"):
        DynamicLossScaler(style="deepspeed", hysteresis=0)
