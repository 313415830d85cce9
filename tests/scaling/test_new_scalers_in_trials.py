"""DeepSpeed's dynamic style, layerwise dynamic and amax scaling inside real trials (trial.py, the engine's
loop and hooks, checkpoints).

A trial stopped after its step-4 checkpoint and run again from it must log the same losses,
loss scales, overflow and skip flags as one that never stopped: the scaler's state (per-point
scales, growth trackers, amax history, DeepSpeed's hysteresis counter) travels through the
checkpoint file as trial.py writes and reads it (``torch.load(weights_only=True)``). The
per-step telemetry (``loss_scale``, ``overflow``, ``skipped``) and the per-layer scale columns
of the layer history come from the same runs.
"""

from __future__ import annotations

import csv

import pytest

from helpers import crash_and_resume, study_yaml
from lossscale_bench.study import load_study_text


def _study(entry: str) -> str:
    """The base study in fp8-emulated, 8 iterations, one scaling row."""
    return study_yaml(
        precision="fp8-emulated", scaling=[entry], schedule={"iterations": 8, "lr": 0.01, "warmup_iterations": 2}
    )


@pytest.mark.parametrize(
    "entry",
    [
        "{method: dynamic, style: deepspeed, interval: 2, init_scale: 1.0e+6, hysteresis: 2}",
        # 1.0e+6 skipped all 8 steps: such a run is now diverged; 1.0e+5 skips, backs off, trains
        "{method: layerwise_dynamic, init_scale: 1.0e+5, interval: 2}",
        "{method: amax, recipe: delayed, history: 3, margin: 8}",
    ],
)
def test_resumed_trial_continues_identically(tmp_path, monkeypatch, entry):
    cfg = load_study_text(_study(entry)).trials()[0]

    def crashed(out):
        assert out.status == "failed"

    (a, straight), (_, first), (b, second) = crash_and_resume(cfg, tmp_path, monkeypatch, after_crash=crashed)
    assert a.status == b.status == "finished"
    assert second.tag_values["lsbench.resumed_from_step"] == 4
    for key in ("loss", "loss_scale", "overflow", "skipped"):
        resumed = dict([x for x in first.history(key) if x[0] <= 4] + second.history(key))
        assert resumed == dict(straight.history(key)), key
        assert len(resumed) == 8
    scales = dict(straight.history("loss_scale"))
    if "init_scale: " in entry:  # a start far too high for E5M2: overflow, skipped steps, the scale comes down
        start = float(entry.split("init_scale: ")[1].split(",")[0])
        assert dict(straight.history("skipped"))[1] == 1.0 and min(scales.values()) < start
    with (tmp_path / "a" / "layers_history.csv").open() as f:
        rows = list(csv.DictReader(f))
    if "dynamic," not in entry:  # per-layer methods fill the per-layer scale columns
        assert any(r.get("accum_scale") not in (None, "") for r in rows)
