"""A Lightning 2.x precision plugin: any loss-scaling method and any precision in a ``lightning.Trainer``.

::

    import lightning as L
    from lossscale_bench.lightning import LossScalingPrecision

    plugin = LossScalingPrecision(method="adaptive", precision="fp8-emulated")
    trainer = L.Trainer(accelerator="cpu", plugins=[plugin])
    trainer.fit(module, loader)

The plugin plays the part of Lightning's ``MixedPrecision`` with its ``GradScaler`` replaced
(``convert_module``, ``forward_context``, ``pre_backward``, ``optimizer_step``, ``state_dict``): it
installs the precision's emulation on the LightningModule (``convert_module``), runs the forward under
the precision's autocast dtype (none for the emulated ones, which compute in fp32), scales the loss
before backward, unscales before Lightning's gradient clipping, skips the optimizer step on an overflow
and updates the scale. Its state (the scaler's, and the precision's random streams) is saved in
Lightning's checkpoints under the plugin's class name, so ``fit(ckpt_path=...)`` continues the scales
exactly. :meth:`LossScalingPrecision.metrics` gives the step's numbers to log with ``self.log_dict``.

One device. On several (DDP), the global methods (``none``, ``fixed``, ``dynamic``, ``saturation``)
agree on overflow across replicas (their flag is all-reduced, as GradScaler's is) while DDP averages
gradients that all carry the same scale; the per-layer methods are refused, because DDP averages
gradients in backward whose layers' scales may differ from replica to replica (the study runner's
data parallelism unscales before it averages).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from lightning.pytorch.plugins.precision import Precision as LightningPrecision

from .library import create_precision, create_scaler
from .scaling import LossScaler, method_class

__all__ = ["LossScalingPrecision"]


class LossScalingPrecision(LightningPrecision):
    """Lightning precision plugin applying a precision (its emulation, its autocast) and a loss scaler.

    Args:
        method: a registered loss-scaling method (``dynamic``, ``adaptive``, ``amax``, ...).
        precision: a registered precision (``fp32``, ``bf16``, ``fp16-emulated``, ``fp8-emulated``, ...);
            the scaler keeps gradients inside its gradient format (``create_scaler``'s ``precision``).
        **options: the method's options, as :func:`lossscale_bench.create_scaler` takes them.
    """

    def __init__(self, method: str = "dynamic", precision: str = "fp32", **options: Any) -> None:
        method_class(method)  # an unknown method fails here, not at fit
        self.method = method
        #: the lossscale_bench precision (Lightning's own ``precision`` attribute stays its string)
        self.number_format = create_precision(precision)
        self.options = dict(options)
        #: the scaler, created with the model in :meth:`convert_module`
        self.scaler: LossScaler | None = None
        self._emulation = None
        self._pending: dict[str, Any] | None = None
        self._device_type = "cpu"

    # -- the model ------------------------------------------------------------------------
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Install the precision's emulation on ``module`` and create the scaler on it (once)."""
        if self.scaler is not None:
            return module
        if method_class(self.method)[1] and _world_size() > 1:
            raise RuntimeError(
                f"LossScalingPrecision(method={self.method!r}) runs on one device: a per-layer method's scales "
                "differ across replicas while DDP averages their gradients (module doc)"
            )
        self._emulation = self.number_format.prepare(module)
        self.scaler = create_scaler(self.method, module, precision=self.number_format, **self.options)
        if self._pending is not None:
            self._load(self._pending)
            self._pending = None
        return module

    def connect(self, model, optimizers, lr_schedulers):
        """Note the device the model lives on (for autocast)."""
        param = next(model.parameters(), None)
        self._device_type = param.device.type if param is not None else "cpu"
        return super().connect(model, optimizers, lr_schedulers)

    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        """The precision's autocast (bf16, mixed16); none for fp32 and the emulated precisions."""
        dtype = self.number_format.autocast_dtype
        with torch.autocast(self._device_type, dtype=dtype) if dtype is not None else nullcontext():
            yield

    # -- a step -----------------------------------------------------------------------------
    def pre_backward(self, tensor: torch.Tensor, module) -> torch.Tensor:
        """Scale the loss before Lightning runs its backward (``MixedPrecision``'s place for it)."""
        tensor = self.scaler.scale(tensor) if self.scaler is not None else tensor
        return super().pre_backward(tensor, module)

    def optimizer_step(self, optimizer, model, closure: Callable[[], Any], **kwargs: Any) -> Any:
        """Run the closure (forward and backward), unscale (Lightning clips true gradients after this),
        then the scaler's step (skipped on an overflow: None) and update."""
        closure_result = closure()
        skip = closure_result is None and model.automatic_optimization  # backward skipped: nothing to unscale
        if not skip:
            self.number_format.unscale_grads(self.scaler, optimizer, needed=True)
        self._after_closure(model, optimizer)
        if skip:
            return closure_result
        out = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return out

    def metrics(self, layers: bool = False) -> dict[str, float]:
        """The scaler's numbers after the last step, as plain floats for ``self.log_dict``: ``loss_scale``,
        ``step_skipped`` and ``step_overflow`` (0 or 1) and the method's metrics (per-layer methods: their
        layers' scales in log2); with ``layers``, ``layer_scale/<layer>`` for every layer too."""
        if self.scaler is None:
            return {}
        out = {k: float(v) for k, v in self.scaler.metrics().items()}
        last = self.scaler.last_step
        if last is not None:
            out.update(step_skipped=float(last.skipped), step_overflow=float(last.overflow))
        if layers:
            out.update({f"layer_scale/{row['layer']}": float(row["scale"]) for row in self.scaler.layer_table()})
        return out

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The scaler's and the precision's state (saved by Lightning under this class's name)."""
        if self.scaler is None:
            return dict(self._pending or {})
        return {"method": self.method, "scaler": self.scaler.state_dict(), "precision": self.number_format.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (kept until the scaler exists, if it does not yet)."""
        if state_dict.get("method", self.method) != self.method:
            raise ValueError(f"checkpoint's loss scaling is {state_dict['method']!r}, this plugin's is {self.method!r}")
        if self.scaler is None:
            self._pending = dict(state_dict)
        else:
            self._load(state_dict)

    def _load(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state.get("scaler", {}))
        self.number_format.load_state_dict(state.get("precision", {}))

    def teardown(self) -> None:
        """Take the scaler's patches and the emulation off the model; the state is kept for a later fit."""
        if self.scaler is not None:
            self._pending = self.state_dict()
            self.scaler.remove()
            self.scaler = None
        if self._emulation is not None:
            self._emulation.remove()
            self._emulation = None
        super().teardown()


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
