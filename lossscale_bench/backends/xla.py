"""XLA backend (TPU, or a CPU XLA device with ``PJRT_DEVICE=CPU``), written against torch_xla's documented API.

torch_xla has no fp16 loss-scaling path (its GradScaler went with XLA:CUDA),
so studies on XLA compare bf16 runs; study validation refuses ``mixed16``
with backend xla. Each iteration is cut into a graph with ``xm.optimizer_step``
(which also all-reduces gradients across replicas) and ``mark_step``.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from .base import Backend, BackendUnavailable

INSTALL_HINT = (
    "pip install 'lossscale_bench[tpu]' (torch-xla; it pins its own torch version: "
    "torch-xla 2.9.0 needs torch 2.9.0, see `make test-xla`)"
)


def _import_xla():
    try:
        import torch_xla  # noqa: F401
        import torch_xla.core.xla_model as xm
    except Exception as exc:  # noqa: BLE001 - ImportError or undefined-symbol OSError
        raise BackendUnavailable(
            f"backend xla: cannot import torch_xla ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); {INSTALL_HINT}"
        ) from None
    return xm


class XLABackend(Backend):
    name = "xla"
    ray_resource = "TPU"

    def __init__(self) -> None:
        super().__init__()
        self._xm = _import_xla()
        import torch_xla

        self.device = torch_xla.device()

    def autocast(self, dtype: torch.dtype | None) -> ContextManager:
        if dtype is None:
            return contextlib.nullcontext()
        if dtype != torch.bfloat16:
            raise BackendUnavailable("backend xla: only bf16 autocast exists on XLA; use precision bf16")
        if self._xm.xla_device_hw(self.device) not in ("TPU", "NEURON"):
            # torch_xla 2.9's autocast is TPU-only: on the XLA CPU device entering it fails
            # (measured with `make test-xla`), so bf16 there means no autocast region.
            return contextlib.nullcontext()
        from torch_xla.amp import autocast

        return autocast(self.device, dtype=torch.bfloat16)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._xm.optimizer_step(optimizer)

    def after_step(self) -> None:
        self._xm.mark_step()

    def synchronize(self) -> None:
        self._xm.wait_device_ops()

    def describe(self) -> str:
        return f"xla ({self.device})"
