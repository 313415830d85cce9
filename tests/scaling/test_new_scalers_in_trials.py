"""The issue-12 scalers inside real trials (trial.py, the engine's loop and hooks, checkpoints).

A trial stopped after its step-4 checkpoint and run again from it must log the same losses,
loss scales, overflow and skip flags as one that never stopped: the scaler's state (per-point
scales, growth trackers, amax history, DeepSpeed's hysteresis counter) travels through the
checkpoint file as trial.py writes and reads it (``torch.load(weights_only=True)``). The
per-step telemetry (``loss_scale``, ``overflow``, ``skipped``) and the per-layer scale columns
of the layer history come from the same runs.
"""

from __future__ import annotations

import csv
import textwrap

import pytest
import torch

from lossscale_bench.sink import MemorySink
from lossscale_bench.study import load_study_text
from lossscale_bench.trial import run_trial

STUDY = textwrap.dedent("""\
    name: t
    dataset: {name: synthetic, train_images: 16, val_images: 4, image_size: 64, seed: 0}
    model: ssd_tiny
    model_options: {width: 8}
    batch_size: 4
    precision: fp8-emulated
    scaling:
      - %s
    seeds: [0]
    schedule: {iterations: 8, lr: 0.01, warmup_iterations: 2}
    eval: {every: null, metric: coco}
    log_every: 2
    """)


@pytest.mark.parametrize("entry", [
    "{method: dynamic, style: deepspeed, interval: 2, init_scale: 1.0e+6, hysteresis: 2}",
    "{method: layerwise_dynamic, init_scale: 1.0e+6, interval: 2}",
    "{method: amax, recipe: delayed, history: 3, margin: 8}",
])
def test_resumed_trial_continues_identically(tmp_path, monkeypatch, entry):
    from lossscale_bench.engine import loop

    cfg = load_study_text(STUDY % entry).trials()[0]
    before = torch.get_num_threads()
    try:
        straight = MemorySink()
        a = run_trial(cfg, sink=straight, trial_dir=tmp_path / "a", threads=1, checkpoint_every=4)
        real_step = loop.Trainer.train_step

        def stop_after_4(self, images, targets):
            if self.state.step == 5:
                raise RuntimeError("simulated crash")
            return real_step(self, images, targets)

        monkeypatch.setattr(loop.Trainer, "train_step", stop_after_4)
        first = MemorySink()
        crashed = run_trial(cfg, sink=first, trial_dir=tmp_path / "b", threads=1, checkpoint_every=4)
        assert crashed.status == "failed"
        monkeypatch.setattr(loop.Trainer, "train_step", real_step)
        second = MemorySink()
        b = run_trial(cfg, sink=second, trial_dir=tmp_path / "b", threads=1, checkpoint_every=4)
    finally:
        torch.set_num_threads(before)
    assert a.status == b.status == "finished"
    assert second.tag_values["lsbench.resumed_from_step"] == 4
    for key in ("loss", "loss_scale", "overflow", "skipped"):
        resumed = dict([x for x in first.history(key) if x[0] <= 4] + second.history(key))
        assert resumed == dict(straight.history(key)), key
        assert len(resumed) == 8
    scales = dict(straight.history("loss_scale"))
    if "1.0e+6" in entry:  # a start far too high for E5M2: overflow, skipped steps, the scale comes down
        assert dict(straight.history("skipped"))[1] == 1.0 and min(scales.values()) < 1.0e6
    with (tmp_path / "a" / "layers_history.csv").open() as f:
        rows = list(csv.DictReader(f))
    if "dynamic," not in entry:  # per-layer methods fill the per-layer scale columns
        assert any(r.get("accum_scale") not in (None, "") for r in rows)
