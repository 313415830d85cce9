"""The scalers and precisions in any training loop: the public factory and the per-layer telemetry.

A study builds its scalers and precisions from the study file; a loop of one's own builds them here, by
the same names and options::

    from lossscale_bench import create_precision, create_scaler

    precision = create_precision("fp8-emulated")
    handle = precision.prepare(model)              # the emulation's rounding on the model
    with create_scaler("adaptive", model, precision="fp8-emulated") as scaler:
        ...                                        # GradScaler's loop: scale, unscale_, step, update

Every scaler has ``torch.amp.GradScaler``'s interface (:class:`~lossscale_bench.scaling.base.LossScaler`);
docs/guide/own-loop.md shows whole loops and says where a scaler behaves unlike GradScaler, and why.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from .precision import Precision, get_precision
from .precision.telemetry import UnderflowProbe, summarize
from .scaling import DisabledLossScaler, LossScaler, build_scaler, method_class

__all__ = ["GRADSCALER_NAMES", "LayerTelemetry", "create_precision", "create_scaler", "layer_telemetry"]

#: GradScaler's keyword names that a scaler taking the study's name for the same option accepts too
GRADSCALER_NAMES = {"growth_interval": "interval"}

#: constructor parameters that are not options (the model, and the gradient format ``precision`` gives)
_NOT_OPTIONS = ("self", "model", "grad_format")


def create_precision(name: str, **options: Any) -> Precision:
    """The registered precision ``name`` (``fp32``, ``bf16``, ``fp16-emulated``, ``fp8-emulated``, ...).

    ``options`` are the study file's precision options of that entry (``grad_rounding``, ``grad_overflow``,
    ``grad_blocks``, ``fp4_rounding``, ...; ``seed`` seeds stochastic rounding). ``precision.prepare(model)``
    installs an emulated precision's rounding on any ``nn.Module`` (its Conv2d/Linear layers) and returns
    the handle whose ``remove()`` takes it off again (None for a precision that emulates nothing);
    ``precision.autocast_dtype`` is the dtype for ``torch.autocast`` (None: no autocast region);
    ``precision.grad_format`` the gradients' format a scaler keeps them inside. An emulated precision
    with ``grad_rounding="after_unscale"`` rounds gradients after unscaling: call
    ``precision.unscale_grads(scaler, optimizer)`` between ``backward`` and ``scaler.step``.
    """
    return get_precision(name, **options)


def _grad_format(precision: str | Precision | None):
    if precision is None:
        return None
    prec = precision if isinstance(precision, Precision) else get_precision(precision)
    return prec.grad_format


def create_scaler(
    method: str,
    model: nn.Module | None = None,
    *,
    precision: str | Precision | None = None,
    enabled: bool = True,
    **options: Any,
) -> LossScaler:
    """A loss scaler of the registered ``method`` with ``torch.amp.GradScaler``'s interface.

    Args:
        method: ``none``, ``fixed``, ``dynamic``, ``adaptive``, ``layerwise_dynamic``, ``amax``,
            ``saturation`` (or a method registered by a plug-in).
        model: the model; required by the per-layer methods (``adaptive``, ``layerwise_dynamic``,
            ``amax``), which patch its Conv2d/Linear layers until ``remove()`` or the end of a ``with``
            block. Give it after ``precision.prepare(model)``.
        precision: a registered precision's name (or a :class:`~lossscale_bench.precision.Precision`)
            whose gradient format the scaler keeps gradients inside (the per-layer rules' range, the
            saturation scaler's maximum). Without it, or with a precision whose gradients are fp32 (``fp32``,
            ``bf16``), the methods take the gradients to be fp16, as GradScaler's loops have them.
        enabled: ``False`` gives a scaler that does nothing (GradScaler's ``enabled=False``): ``scale``
            returns its input, ``step`` runs the optimizer, no gradient is checked, the model is not touched.
        **options: the study file's options of that method (``init_scale``, ``interval``, ``style``, ...:
            docs/reference/study-file.md). GradScaler's ``growth_interval`` is accepted for ``interval``;
            the dynamic method also takes ``growth_factor`` and ``backoff_factor``. Note: the dynamic
            method's default style is ``chainer`` (the study's: starts at 1); ``style="torch"`` is GradScaler's.

    Raises:
        ValueError: an unknown method, a per-layer method without its model, a bad option value.
        TypeError: an option the method does not take (the message lists those it does).
    """
    if not enabled:
        return DisabledLossScaler()
    cls, per_layer, _ = method_class(method)
    options = _with_study_names(cls, method, options)
    if per_layer and model is None:
        raise ValueError(
            f"create_scaler({method!r}) needs the model: create_scaler({method!r}, model), after "
            "precision.prepare(model) (the method scales every Conv2d/Linear layer of it)"
        )
    return build_scaler({"method": method}, model if per_layer else None, _grad_format(precision), **options)


def _with_study_names(cls: type, method: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with GradScaler's names mapped to the study's, checked against the scaler's constructor."""
    params = inspect.signature(cls.__init__).parameters
    allowed = [n for n, p in params.items() if n not in _NOT_OPTIONS and p.kind is not p.VAR_KEYWORD]
    out = dict(options)
    for theirs, ours in GRADSCALER_NAMES.items():
        if theirs in out and ours in allowed and theirs not in allowed:
            if ours in out:
                raise TypeError(f"create_scaler({method!r}): give {ours!r} or {theirs!r}, not both")
            out[ours] = out.pop(theirs)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [k for k in out if k not in allowed]
    if unknown and not takes_any:
        raise TypeError(f"create_scaler({method!r}): unknown option {unknown[0]!r}; allowed: {', '.join(allowed)}")
    return out


class LayerTelemetry:
    """Per-layer numbers for a loop of one's own: what a study logs each logged step, as plain floats.

    For each Conv2d/Linear layer, the gradients arriving at its output during an armed backward are counted
    against the gradient format (``flush_rate``: share of non-zero gradient elements the format flushes to
    zero; ``underflow_rate``: subnormal in it; ``saturate_rate``: past its maximum; ``param_*``: the same
    of the layer's parameter gradients; ``nonzero``: how many were counted), and a per-layer scaler adds its
    layer's numbers (``scale``, ``prev_scale``, ``accum_scale`` and the method's own columns, such as
    adaptive's ``unbounded_scale``). Use it as a context manager (:func:`layer_telemetry`); :meth:`arm`
    before the forward of a step to count, :meth:`read` after its ``scaler.update()``.

    Create it after ``precision.prepare(model)`` and pass the handle as ``emulation``: it then sees the
    gradients before the emulation rounds them (flushed elements are still visible).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        scaler: LossScaler | None = None,
        precision: str | Precision | None = None,
        emulation=None,
    ) -> None:
        prec = get_precision(precision) if isinstance(precision, str) else precision
        fmt = prec.telemetry_format if prec is not None else None
        rounds_later = prec is not None and prec.rounds_after_unscale
        kwargs = {} if fmt is None else {"fmt": fmt}
        self.scaler = scaler
        self._probe = UnderflowProbe(model, emulation=emulation, param_grads=not rounds_later, **kwargs)

    def arm(self) -> None:
        """Count the gradients of the next backward (until :meth:`read`)."""
        self._probe.arm()

    def read(self) -> dict[str, dict[str, float]]:
        """``layer -> {name: number}`` of the last armed backward and the scaler's layers (then disarmed);
        the scaler's rows alone where nothing was armed. One host synchronisation."""
        self._probe.disarm()
        out: dict[str, dict[str, float]] = {k: dict(v) for k, v in self._probe.read().items()}
        if self.scaler is not None:
            for row in self.scaler.layer_table():
                numbers = {
                    k: float(v)
                    for k, v in row.items()
                    if k != "layer" and isinstance(v, (int, float)) and not isinstance(v, bool)
                }
                out.setdefault(row["layer"], {}).update(numbers)
        return out

    @staticmethod
    def summary(rates: dict[str, dict[str, float]]) -> dict[str, float]:
        """The study's step metrics from :meth:`read`'s rates (``flush_rate_max``, ``flush_rate_mean``, ...)."""
        return summarize(rates)

    def remove(self) -> None:
        """Take the counting hooks off the model."""
        self._probe.remove()

    def __enter__(self) -> LayerTelemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def layer_telemetry(
    model: nn.Module, *, scaler: LossScaler | None = None, precision: str | Precision | None = None, emulation=None
) -> LayerTelemetry:
    """``with layer_telemetry(model, scaler=scaler, precision="fp8-emulated") as tel:`` (:class:`LayerTelemetry`)."""
    return LayerTelemetry(model, scaler=scaler, precision=precision, emulation=emulation)
