"""The accelerator's code path of every per-layer method gives the CPU path's results, bit for bit.

On the CPU the per-layer scalers take host shortcuts (Python floats for the rules' scalar arithmetic, one read
of the groups' flags); an accelerator runs their device code: the adaptive bound in parts, amax's point lists,
the batched unscaling, layer-wise dynamic's flags read with the verdict. ``core.host_path.device_path`` makes
the CPU run that device code. Each method here trains a trial of the tiny SSD (E4M3 gradients, so the first
steps overflow and the layer-wise scales back off) both ways from the same seed, and the weights after every
step, each step's result and the scaler's metrics must be equal. ``tools/weights_digest.py --device-path``
does the same for whole studies.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from pathlib import Path

import pytest
import torch

from helpers import trial_trainer
from lossscale_bench.core.host_path import device_path

METHODS = {
    "adaptive": {"method": "adaptive"},
    # a low accumulated bound: the headroom carried from layer to layer decides most layers' scales
    "adaptive, accum_upper_bound 4": {"method": "adaptive", "accum_upper_bound": 4},
    "adaptive, update_every 3, output scaling": {"method": "adaptive", "update_every": 3, "output_scaling": True},
    # an overflow the scalers see (NaN, not E4M3's saturation): steps skipped, layer-wise scales backing off
    "layerwise_dynamic": {"method": "layerwise_dynamic", "interval": 2, "grad_overflow": "nan"},
    "adaptive, overflow -> NaN, init_scale 1024": {"method": "adaptive", "init_scale": 1024, "grad_overflow": "nan"},
    "amax current": {"method": "amax", "recipe": "current", "margin": 1},
    "amax delayed": {"method": "amax", "recipe": "delayed", "history": 4},
    # scales that follow every layer's amax exactly (no power of two); the loss point's amax is the same at every
    # step of this toy, so test_amax.py checks the next loss scale read with the verdict on random histories
    "amax delayed, exact scales": {"method": "amax", "recipe": "delayed", "history": 3, "power_of_two": False},
    "amax current, exact scales": {"method": "amax", "recipe": "current", "power_of_two": False},
}
STEPS = 8


def _weights(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def _run(entry: dict, on_device: bool) -> list:
    torch.set_num_threads(1)
    out = []
    with tempfile.TemporaryDirectory() as d, device_path() if on_device else contextlib.nullcontext():
        trainer = trial_trainer(Path(d), entry, log_every=1)
        for _ in range(STEPS):
            record = trainer.train_step(*next(trainer.batches)[1:])
            loss = record.loss
            out.append(
                (record.result, loss if loss == loss else "nan", trainer.scaler.metrics(), _weights(trainer.model))
            )
        trainer.scaler.remove()
    return out


@pytest.mark.parametrize("label", list(METHODS))
def test_the_device_path_trains_as_the_cpu_path(label):
    cpu, device = _run(METHODS[label], False), _run(METHODS[label], True)
    for step, (a, b) in enumerate(zip(cpu, device), 1):
        assert a == b, (label, step)
    if "NaN" in label or label == "layerwise_dynamic":  # overflows were found (and drove back-offs) on both paths
        assert any(result.overflow for result, _, _, _ in cpu)
    if label == "layerwise_dynamic":
        assert any(m["lw_points_backed_off"] > 0 for _, _, m, _ in cpu)


@pytest.mark.parametrize("label", ["adaptive, update_every 3, output scaling", "amax delayed"])
def test_what_a_step_reads_once_is_that_steps(label, monkeypatch):
    # the scalers read their tables to the host once a step and keep it for the step's metrics and layer table:
    # each step's copy must be that step's, i.e. equal to a fresh read
    from lossscale_bench.scaling.amax import AmaxLossScaler
    from lossscale_bench.scaling.per_layer import PerLayerLossScaler

    seen = []
    real_metrics = PerLayerLossScaler.metrics

    def metrics(self):
        kept = dict(real_metrics(self)), self.layer_table()
        self._recorded_rows = None
        if isinstance(self, AmaxLossScaler):
            self._view = None
        seen.append((repr(kept), repr((real_metrics(self), self.layer_table()))))  # repr: NaN equals NaN
        return kept[0]

    monkeypatch.setattr(PerLayerLossScaler, "metrics", metrics)
    _run(METHODS[label], False)
    assert len(seen) >= STEPS
    assert all(kept == fresh for kept, fresh in seen)
