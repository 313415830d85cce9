"""LossScalingPrecision in a real lightning.Trainer on the CPU: fit, checkpoint, resume, telemetry (lossscale_bench/lightning.py)."""

from __future__ import annotations

import csv
import logging

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")

from lossscale_bench.lightning import LossScalingPrecision  # noqa: E402

OVERFLOW_AT = {1, 4, 7}  # (the resumed fit starts at step 6)  # global steps whose gradients get an inf after backward
BATCHES = 3  # an epoch; fits end at epoch ends (max_epochs), where a resumed fit starts cleanly


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
        self.seen: list[dict[str, float]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_after_backward(self):
        if self.global_step in OVERFLOW_AT:
            self.net[0].weight.grad[0, 0] = float("inf")

    def on_train_batch_end(self, outputs, batch, batch_idx):
        numbers = self.trainer.precision_plugin.metrics(layers=True)
        self.log_dict(numbers)
        self.seen.append(numbers)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader():
    g = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(
        torch.randn(BATCHES * 4, 4, generator=g), torch.randn(BATCHES * 4, 3, generator=g)
    )
    return torch.utils.data.DataLoader(data, batch_size=4, shuffle=False)


def _fit(tmp_path, name, module, plugin, epochs, ckpt=None):
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        plugins=[plugin],
        logger=L.pytorch.loggers.CSVLogger(tmp_path, name=name),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(module, _loader(), ckpt_path=ckpt)
    return trainer


PLUGINS = {
    "dynamic": lambda: LossScalingPrecision(method="dynamic", style="torch", init_scale=2.0**8, growth_interval=2),
    "adaptive-fp8": lambda: LossScalingPrecision(method="adaptive", precision="fp8-emulated", init_scale=4.0),
}


@pytest.mark.parametrize("kind", list(PLUGINS))
def test_fit_checkpoint_resume_continues_the_scales_exactly(tmp_path, kind):
    whole = Net()
    _fit(tmp_path, "whole", whole, PLUGINS[kind](), 4)

    first = Net()
    trainer = _fit(tmp_path, "first", first, PLUGINS[kind](), 2)
    ckpt = tmp_path / "half.ckpt"
    trainer.save_checkpoint(ckpt)
    state = torch.load(ckpt, weights_only=False)["LossScalingPrecision"]
    assert state["method"] == kind.split("-")[0] and state["scaler"]  # the scaler's state is in the checkpoint
    assert not any("forward" in m.__dict__ for m in first.modules())  # fit's end took the patches off

    second = Net()
    _fit(tmp_path, "second", second, PLUGINS[kind](), 4, ckpt=str(ckpt))
    assert first.seen + second.seen == whole.seen  # every step's scales (and skips) as in one fit
    if kind == "dynamic":
        assert len({s["loss_scale"] for s in whole.seen}) > 2 and sum(s["step_skipped"] for s in whole.seen) == 3
    else:
        assert any(k.startswith("layer_scale/") for k in whole.seen[0])
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), second.parameters()))


def test_telemetry_reaches_lightnings_logger(tmp_path):
    module = Net()
    trainer = _fit(tmp_path, "log", module, PLUGINS["adaptive-fp8"](), 1)
    rows = list(csv.DictReader(open(trainer.logger.log_dir + "/metrics.csv")))
    assert len(rows) == BATCHES
    assert {"loss_scale", "step_skipped", "layer_scale/net.0", "layer_scale/net.2", "ada_scale_log2_median"} <= set(
        rows[0]
    )
    assert float(rows[0]["loss_scale"]) == 4.0


def test_unknown_method_fails_at_construction():
    with pytest.raises(ValueError, match="unknown scaling method"):
        LossScalingPrecision(method="nope")
