"""The runtime precision of a precision table entry: fp32 | mixed16 | bf16 | the emulated ones.

A ``Precision`` says which dtype autocast uses, whether a loss scaler is
meaningful, and in which formats (:mod:`lossscale_bench.precision.formats`) its forward
values and its gradients live; it does not know devices (the backend opens
the autocast region).

The emulated precisions exist because real fp16 on CPU is ~45x slower than
fp32 and CPUs have no fp8 arithmetic at all: they compute in fp32 and round
to the format where the hardware would (:mod:`.layers`).

* ``fp16-emulated``: fp16 everywhere (Chainer's / PyTorch AMP's mixed16).
* ``fp8-emulated``: forward outputs in E4M3, gradients in E5M2, fp32 master
  weights (the split FP8 training recipes use). E5M2's smallest subnormal is
  2**-16 ~ 1.5e-5, 256x fp16's, so gradients a small model's fp16 keeps
  flush here: underflow is real at CPU scale.

They are emulations, and reports say so.

Parameter gradients: two orders (``grad_rounding``)
---------------------------------------------------
* ``before_unscale`` (the default): the accumulated gradient is rounded to ``grad_format``
  while it still carries the loss scale ``P``; the scaler then unscales it in fp32. This is
  PyTorch AMP's order (fp16 weight gradients computed at scale ``P``, ``GradScaler.unscale_``
  on the fp32 copy).
* ``after_unscale``: the gradient is unscaled first (in fp32) and then rounded, as Chainer's
  mixed16 and the adaptive-scaling authors' code do (gradients divided by ``P`` and stored in
  fp16 before the fp32 update). A true gradient below the format's smallest subnormal flushes
  here but survives the default order when ``P`` lifts it; past ``u_max`` it becomes inf and the
  step is skipped. A training loop calls :meth:`Precision.unscale_grads` between backward and
  ``scaler.step``: it unscales (``scaler.unscale_``), rounds (:meth:`Precision.round_unscaled_grads`)
  and adds an overflow the rounding made to the scaler's step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..study.precisions import GRAD_ROUNDINGS, PRECISION_NAMES, PRECISION_OPTIONS, PRECISION_SPECS
from .formats import E4M3_NAN, FORMATS, FP16, FloatFormat, Fp4Format, block_scaled, fp4_format
from .layers import EmulationHandle, install_emulation

__all__ = ["Precision", "get_precision"]


@dataclass(frozen=True)
class Precision:
    """What a trial computes in: the autocast dtype, the formats of forward values and gradients, and
    whether a loss scaler matters (``needs_scaler``); the emulated ones install their rounding on the model."""

    name: str
    #: dtype for autocast, or None for no autocast region
    autocast_dtype: torch.dtype | None
    #: whether low-precision underflow/overflow exists, so a loss scaler matters
    needs_scaler: bool
    #: emulated in fp32 (CPU), to be labelled as such
    emulated: bool = False
    #: format of conv/linear outputs (None: fp32)
    forward_format: FloatFormat | None = None
    #: format of activation and parameter gradients (None: fp32); the adaptive rule's range and
    #: the telemetry's thresholds come from it
    grad_format: FloatFormat | None = None
    #: emulated only: when parameter gradients are rounded to grad_format (module doc)
    grad_rounding: str = "before_unscale"
    #: FP4 forward values in NVFP4: weights rounded in the forward product (NVFP4 16x16 tiles)
    weight_format: FloatFormat | None = None
    #: the Hadamard transform of the weight-gradient product's gradient input (fp4_layers)
    wgrad_hadamard: bool = False

    def state_dict(self) -> dict[str, dict]:
        """What a resumed trial needs of the precision: the position of each stochastic-rounding stream,
        by the role of the format that draws from it (empty where nothing is rounded stochastically)."""
        return {role: stream.state_dict() for role, stream in self._streams()}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        """Move the streams to the positions :meth:`state_dict` gave (a role missing in ``state``, as in
        checkpoints written before the streams were saved, keeps its stream where it is)."""
        for role, stream in self._streams():
            if role in state:
                stream.load_state_dict(state[role])

    def _streams(self):
        for role in ("forward_format", "grad_format", "weight_format"):
            stream = getattr(getattr(self, role), "stream", None)
            if stream is not None:
                yield role, stream

    @property
    def rounds_after_unscale(self) -> bool:
        """Whether gradients are rounded after unscaling, every step (:meth:`unscale_grads` does both)."""
        return self.emulated and self.grad_rounding == "after_unscale"

    def prepare(self, model: nn.Module) -> EmulationHandle | None:
        """Install whatever the precision needs on the model (the emulation's rounding hooks)."""
        if self.emulated:
            return install_emulation(
                model,
                self.forward_format,
                self.grad_format,
                round_param_grads=not self.rounds_after_unscale,
                weight_format=self.weight_format,
                wgrad_hadamard=self.wgrad_hadamard,
            )
        return None

    def unscale_grads(self, scaler, optimizer, *, needed: bool = False) -> bool:
        """Unscale ``optimizer``'s gradients through ``scaler.unscale_`` where the caller needs true values
        (``needed``: clipping, say) or where this precision stores gradients after unscaling
        (:attr:`rounds_after_unscale`: they are then rounded to ``grad_format`` and an overflow the rounding
        makes is added to the scaler's step). A training loop calls it between ``backward`` and
        ``scaler.step``; returns whether the gradients are unscaled now."""
        if not (needed or self.rounds_after_unscale):
            return False
        scaler.unscale_(optimizer)
        if self.rounds_after_unscale:  # Chainer's order: unscale, then store in the gradient format
            scaler.mark_overflow(self.round_unscaled_grads([p for g in optimizer.param_groups for p in g["params"]]))
        return True

    def round_unscaled_grads(self, params) -> torch.Tensor | None:
        """``after_unscale``: round the (unscaled) gradients of ``params`` to ``grad_format`` in place.

        Returns a 0-d float flag, 1.0 where rounding made a finite gradient non-finite (past the
        format's maximum: the step must be skipped, as a real fp16 gradient store would overflow),
        or None when this precision does not round here.
        """
        if not self.rounds_after_unscale:
            return None
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return torch.zeros(())
        was_finite = torch.stack([torch.isfinite(g).all() for g in grads])
        for g in grads:
            g.copy_(self.grad_format.round(g))
        now_finite = torch.stack([torch.isfinite(g).all() for g in grads])
        return (was_finite & ~now_finite).any().float()

    @property
    def telemetry_format(self) -> FloatFormat:
        """The format underflow is counted against: the gradient format, else fp16 (what an
        fp32 baseline's gradients would lose if they were fp16)."""
        return self.grad_format or FP16


def _build(name: str, seed: int = 0, options: dict | None = None) -> Precision:
    """The runtime precision of a table entry (:mod:`lossscale_bench.study.precisions`) with its
    precision options (None or missing: the option's default); ``seed`` seeds stochastic rounding."""
    spec = PRECISION_SPECS[name]
    opts = {n: o.default for n, o in PRECISION_OPTIONS.items()}
    for k, v in (options or {}).items():
        if v is None:
            continue
        if k not in spec.options:
            raise ValueError(f"{k} is not an option of {name!r}")
        opts[k] = v
    fwd = FORMATS[spec.forward_format] if spec.forward_format else None
    grad = FORMATS[spec.grad_format] if spec.grad_format else None
    weight = None
    if spec.grad_format == "e2m1":
        grad = fp4_format(
            spec.grad_scaling or "e2m1",
            stochastic=opts["fp4_rounding"] == "stochastic",
            mode=opts["mx_exponent"],
            seed=seed,
        )
    if spec.forward_scaling == "nvfp4":  # forward values are rounded to nearest (NVIDIA's recipe)
        fwd, weight = fp4_format("nvfp4"), fp4_format("nvfp4", weight=True)
    return Precision(
        spec.name,
        getattr(torch, spec.autocast) if spec.autocast else None,
        needs_scaler=spec.needs_scaler,
        emulated=spec.emulated,
        forward_format=fwd,
        grad_format=grad,
        weight_format=weight,
        wgrad_hadamard=bool(opts["wgrad_hadamard"]),
    )


def get_precision(
    name: str,
    grad_rounding: str | None = None,
    grad_overflow: str | None = None,
    grad_blocks: str | None = None,
    block_rounding: str | None = None,
    seed: int = 0,
    **options,
) -> Precision:
    """The precision ``name``; ``grad_rounding`` (emulated precisions only) as in the module doc;
    ``grad_overflow`` ``nan`` (E4M3 gradients overflow to NaN instead of saturating) and
    ``grad_blocks`` (block-scaled fp8 gradients, :class:`~.formats.BlockScaledFormat`) change the
    gradient format (the schema allows them only where they mean something). ``options``: the
    precision options (``study.precisions.PRECISION_OPTIONS``) the entry takes; ``seed`` (the
    trial's) seeds the stochastic rounding of FP4 gradients."""
    prec = _with_grad_format(name, grad_overflow, grad_blocks, block_rounding, seed, options)
    if grad_rounding is None or grad_rounding == prec.grad_rounding:
        return prec
    if grad_rounding not in GRAD_ROUNDINGS:
        raise ValueError(f"unknown grad_rounding {grad_rounding!r}; allowed: {', '.join(GRAD_ROUNDINGS)}")
    if not prec.emulated:
        raise ValueError(f"grad_rounding applies to the emulated precisions only, not {name!r}")
    return replace(prec, grad_rounding=grad_rounding)


def _with_grad_format(
    name: str, grad_overflow, grad_blocks, block_rounding, seed: int = 0, options: dict | None = None
) -> Precision:
    try:
        prec = _build(name, seed, options)
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; allowed: {', '.join(PRECISION_NAMES)}") from None
    fmt = prec.grad_format
    if grad_overflow == "nan":
        if fmt is None or fmt.name != "e4m3":
            raise ValueError(f"grad_overflow applies to E4M3 gradients only, not {name!r}")
        fmt = E4M3_NAN
    if grad_blocks not in (None, "none"):
        if not prec.emulated or fmt is None or isinstance(fmt, Fp4Format):
            raise ValueError(f"grad_blocks applies to the emulated fp8 precisions only, not {name!r}")
        fmt = block_scaled(fmt, grad_blocks, block_rounding or "ceil")
    return prec if fmt is prec.grad_format else replace(prec, grad_format=fmt)
