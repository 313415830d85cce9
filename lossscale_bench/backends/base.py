"""The device interface the training loop talks to.

Everything that differs between CPU, CUDA, XLA (TPU) and HPU (Gaudi) sits
here: where tensors live, how autocast is opened, how the optimizer step is
issued (``xm.optimizer_step`` on XLA, ``mark_step`` on HPU), how to wait for
the device, and what Ray must reserve for a trial. The loop never branches
on the device.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch


class BackendUnavailable(RuntimeError):
    """The backend's vendor package or device is missing; the message says how to install it."""


class Backend:
    name = "base"
    #: Ray's resource name for one device of this kind (None: CPU only)
    ray_resource: str | None = None

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    # -- placement -------------------------------------------------------------
    def ray_resources(self, devices: int = 1, cpus: float = 1.0) -> dict[str, float]:
        """What one trial asks Ray for: its CPU share plus its devices."""
        res: dict[str, float] = {"CPU": float(cpus)}
        if self.ray_resource:
            res[self.ray_resource] = float(devices)
        return res

    # -- model and data -------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def to_device(self, images: list[torch.Tensor], targets: list[dict[str, Any]]):
        images = [im.to(self.device, non_blocking=True) for im in images]
        targets = [
            {k: (v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in t.items()}
            for t in targets
        ]
        return images, targets

    # -- numerics -------------------------------------------------------------
    def autocast(self, dtype: torch.dtype | None) -> ContextManager:
        """Open an autocast region for ``dtype`` (None: no autocast)."""
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    # -- stepping -------------------------------------------------------------
    def optimizer_options(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.optim.SGD`` choosing its implementation on this device
        (``foreach``/``fused``); {} keeps torch's choice. The same update, other kernels."""
        return {}

    def after_backward(self) -> None:
        """Hook after ``loss.backward()`` (HPU lazy mode marks a step here)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def after_step(self) -> None:
        """Hook after the optimizer step (XLA/HPU graph cut)."""

    def synchronize(self) -> None:
        """Wait for queued device work (for honest timings)."""

    def memory_stats(self) -> dict[str, float]:
        return {}

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def describe(self) -> str:
        return f"{self.name}:{self.device}"
