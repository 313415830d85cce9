"""A resumed stochastic-FP4 trial is the trial it claims to be.

Stochastic rounding draws one key per rounding call from a stream seeded by the trial's seed. The
stream's position is part of the checkpoint, so a trial that stops after a checkpoint and runs again
from it draws the keys the uninterrupted trial drew: the same logged values at every step and the same
final weights, bit for bit. Checked in-process for the three kinds of FP4 gradients (plain E2M1, NVFP4,
MXFP4), and through the CLI after Ctrl-C (local executor) and after kill -9 of the driver (Ray).
"""

from __future__ import annotations

import hashlib

import pytest

from helpers import crash_and_resume, study_yaml
from lossscale_bench.study import load_study_text

#: a loss scale that keeps FP4 gradients in range, so each rounding's random draw shows in the weights
SCALED = "{method: fixed, scale: 1024}"


def _cfg(precision: str, iterations: int = 10):
    text = study_yaml(
        precision=precision,
        scaling=[SCALED],
        batch_size=4,
        schedule={"iterations": iterations, "lr": 0.01, "warmup_iterations": 2},
        log_every=1,
    )
    return load_study_text(text).trials()[0]


@pytest.mark.parametrize(
    "precision", ["e4m3fwd-e2m1grad-emulated", "e4m3fwd-nvfp4grad-emulated", "e4m3fwd-mxfp4grad-emulated"]
)
def test_resumed_stochastic_fp4_trial_equals_the_uninterrupted_one(tmp_path, monkeypatch, precision):
    cfg = _cfg(precision)
    hashes = _hash_final_weights(monkeypatch)
    (a, straight), _, (b, second) = crash_and_resume(cfg, tmp_path, monkeypatch, crash_at_step=6, checkpoint_every=4)
    assert a.status == b.status == "finished", (a.error, b.error)
    assert second.tag_values["lsbench.resumed_from_step"] == 4
    after = _values_after(straight, 4)
    assert {"loss", "loss_scale", "final_map"} <= {k for k, _, _ in after}, after
    assert _values_after(second, 4) == after
    assert a.final_map == b.final_map
    assert len(hashes) == 2 and hashes[0] == hashes[1]  # the straight run's and the resumed run's


def test_a_checkpoint_holds_the_stream_position(tmp_path):
    """The precision's state is in the checkpoint, and loading it moves the stream there."""
    from lossscale_bench.precision import get_precision

    prec = get_precision("e4m3fwd-nvfp4grad-emulated", seed=3)
    for _ in range(5):
        prec.grad_format.next_key()
    state = prec.state_dict()
    fresh = get_precision("e4m3fwd-nvfp4grad-emulated", seed=3)
    fresh.load_state_dict(state)
    assert fresh.grad_format.next_key() == prec.grad_format.next_key()
    assert get_precision("fp32").state_dict() == {}
    other_seed = get_precision("e4m3fwd-nvfp4grad-emulated", seed=4)
    with pytest.raises(ValueError, match="seed"):
        other_seed.load_state_dict(state)


def _values_after(sink, step: int) -> list[tuple[str, int, float]]:
    """Every logged value after ``step``, less those that measure the machine (time, memory)."""
    return sorted(
        (k, s, v)
        for k, v, s in sink.items
        if s > step and k != "images_per_sec" and not k.startswith(("host_", "device_", "cuda_"))
    )


def _hash_final_weights(monkeypatch) -> list[str]:
    """SHA-256 of the model's weights at the end of every ``Trainer.run`` that returns (a crashed run raises)."""
    import torch

    from lossscale_bench.engine import loop

    hashes: list[str] = []
    real_run = loop.Trainer.run

    def run(self):
        state = real_run(self)
        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
        hashes.append(h.hexdigest())
        return state

    monkeypatch.setattr(loop.Trainer, "run", run)
    return hashes
