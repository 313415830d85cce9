"""Numeric precisions: fp32 | mixed16 | bf16 | fp16-emulated | fp8-emulated.

A ``Precision`` says which dtype autocast uses, whether a loss scaler is
meaningful, and in which formats (:mod:`lossscale_bench.formats`) its forward
values and its gradients live; it does not know devices (the backend opens
the autocast region).

The emulated precisions exist because real fp16 on CPU is ~45x slower than
fp32 (FIELD-NOTES.md) and CPUs have no fp8 arithmetic at all. They compute in
fp32 but round, through the format's torch dtype and back, every conv/linear
output in forward (``forward_format``), every activation gradient arriving at
a conv/linear output in backward, and every parameter gradient once it has
been accumulated (``grad_format``; before the scaler unscales it, as a real
low-precision gradient would be rounded before its fp32 master copy sees it).
Values below half the format's smallest subnormal flush to zero and values
past its maximum become inf (E4M3 saturates, as torch's cast does), so the
underflow and overflow that loss scaling exists to fix appear at fp32 speed.

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
  step is skipped. The training loop calls :meth:`Precision.round_unscaled_grads` right after
  ``scaler.unscale_``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import nn

from .formats import E4M3_NAN, FORMATS, FP16, FloatFormat, block_scaled, fp4_format, Fp4Format
from .fp4_layers import fp4_layer, round_weight, supported
from .numerics.fp8 import is_channels_last
from .numerics.fp8 import not_a_view as _not_a_view
from .core.registry import PRECISIONS
from .study.precisions import PRECISION_OPTIONS, PRECISION_SPECS

#: layer types whose outputs (and the gradients arriving at them) are rounded
EMULATED_LAYERS = (nn.Conv2d, nn.Linear, nn.ConvTranspose2d)


def round_fp16(t: torch.Tensor) -> torch.Tensor:
    """Round through fp16 and back: flush-to-zero below 2**-25, inf past 65504."""
    return FP16.round(t)


class _RoundThrough(torch.autograd.Function):
    """Identity up to rounding: the value to ``fwd`` in forward, its gradient to ``bwd`` in backward
    (either None: that direction stays fp32, as a precision entry with ``forward_format`` or
    ``grad_format`` None asks)."""

    @staticmethod
    def forward(ctx, x, fwd: FloatFormat | None, bwd: FloatFormat | None):  # type: ignore[override]
        ctx.bwd = bwd
        return _not_a_view(x if fwd is None else fwd.round(x), x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return (g if ctx.bwd is None else ctx.bwd.round(g)), None, None


def round_through(x: torch.Tensor, fwd: FloatFormat = FP16, bwd: FloatFormat = FP16) -> torch.Tensor:
    return _RoundThrough.apply(x, fwd, bwd)


def fp16_round_through(x: torch.Tensor) -> torch.Tensor:
    return round_through(x, FP16, FP16)


class EmulationHandle:
    """The hooks an emulated precision installed; ``remove()`` restores the model.

    ``observe_param_grads(fn)``: ``fn(param, grad)`` is called with each accumulated parameter
    gradient just *before* the emulation rounds it (the telemetry counts what the rounding will
    flush or saturate; a hook of its own would run after the rounding, whose results it cannot
    tell from true zeros and true maxima).
    """

    def __init__(self, handles: list, param_observers: list | None = None) -> None:
        self._handles = handles
        self._param_observers = param_observers if param_observers is not None else []
        #: whether parameter gradients are rounded by these hooks (not with ``after_unscale``)
        self.rounds_param_grads = param_observers is not None

    def observe_param_grads(self, fn) -> None:
        self._param_observers.append(fn)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __len__(self) -> int:
        return len(self._handles)


#: the orders in which an emulated precision rounds parameter gradients (module doc)
GRAD_ROUNDINGS = ("before_unscale", "after_unscale")


def install_emulation(model: nn.Module, forward_format: FloatFormat | None, grad_format: FloatFormat | None,
                      round_param_grads: bool = True, weight_format: FloatFormat | None = None,
                      wgrad_hadamard: bool = False) -> EmulationHandle:
    """Round layer outputs to ``forward_format``, their incoming gradients and (unless
    ``round_param_grads`` is false: ``grad_rounding: after_unscale``) the accumulated parameter
    gradients to ``grad_format``. A format that is None leaves its direction in fp32 (the precision
    table allows either: an fp32 forward with rounded gradients, say). ``weight_format`` (weights
    rounded in the forward product, evaluation included) and ``wgrad_hadamard`` go through
    :mod:`.fp4_layers`."""
    handles = []
    if grad_format is None:
        round_param_grads = False

    def out_hook(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return round_through(output, forward_format, grad_format)
        return output

    #: module -> (its weight parameter, the rounded weight standing in for it during the module's forward)
    swapped: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}

    def weight_hook(module, inputs):
        # the forward product computed once, with the rounded weight in the parameter's place (a forward
        # hook that recomputed it cost a second product per layer: issue 32 item 4); the split hook puts
        # the parameter back, also when the forward raised (always_call)
        param = module._parameters["weight"]
        wq = round_weight(module, weight_format)
        swapped[module] = (param, wq)
        module._parameters["weight"] = wq

    def split_hook(module, inputs, output):  # fp4_layers: the weight rounded, or the wgrad path transformed
        wq = None
        if module in swapped:
            param, wq = swapped.pop(module)
            module._parameters["weight"] = param
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return fp4_layer(module, inputs[0], output, forward_format, grad_format, wq, wgrad_hadamard)
        return out_hook(module, inputs, output)

    split = weight_format is not None or wgrad_hadamard
    for m in model.modules():
        if isinstance(m, EMULATED_LAYERS):
            if split and supported(m):
                if weight_format is not None:
                    handles.append(m.register_forward_pre_hook(weight_hook))
                handles.append(m.register_forward_hook(split_hook, always_call=True))
            else:
                handles.append(m.register_forward_hook(out_hook))

    observers: list = []
    pending: list[torch.Tensor] = []
    keys: list = []

    def round_pending() -> None:
        drawn = keys[:] if grad_format.concat_block is None else [None] * len(pending)
        params = [(p, k) for p, k in zip(pending, drawn) if p.grad is not None]
        pending.clear()
        keys.clear()
        for observe in observers:
            for p, _ in params:
                observe(p, p.grad)
        grads = [p.grad for p, _ in params]
        if grad_format.elementwise:
            round_grads_(grad_format, grads)
        elif grad_format.concat_block is not None:
            round_block_grads_(grad_format, grads)
        else:
            grad_format.round_each_(grads, [k for _, k in params])

    def grad_hook(p: torch.Tensor) -> None:
        if p.grad is None:
            return
        # every parameter gradient of this backward rounded at its end: in one call where the format
        # allows it (element-wise, mx32 blocks: round_grads_, round_block_grads_) instead of one
        # kernel call (~0.2 ms of dispatch, and for blocks a layout copy) per parameter; else one tensor
        # at a time through the format's round_each_, with the random key each would have drawn here
        # (drawn now, between the activation gradients' roundings, so the stream and the values are
        # those of a rounding per parameter)
        if not pending:
            torch.autograd.Variable._execution_engine.queue_callback(round_pending)
        pending.append(p)
        if grad_format.concat_block is None:
            keys.append(grad_format.next_key())

    if round_param_grads:
        for p in model.parameters():
            if p.requires_grad:
                handles.append(p.register_post_accumulate_grad_hook(grad_hook))
    return EmulationHandle(handles, observers if round_param_grads else None)


def round_grads_(fmt: FloatFormat, grads: list[torch.Tensor]) -> None:
    """Round ``grads`` to the element-wise format ``fmt`` in place, with one rounding call.

    Why one call: a model has dozens of parameters, most of them small (biases, norms), and a
    compiled rounding kernel costs ~0.2 ms of dispatch per call whatever the size: on ssd_tiny the
    per-parameter calls were ~10 ms of a ~130 ms E4M3 step. Element-wise rounding does not care
    which tensor an element belongs to, so the gradients are concatenated in memory order (a
    channels_last weight gradient is read as NHWC, no layout copy), rounded once and copied back:
    bit for bit the values a call per tensor gives (tested). Gradients of mixed dtypes are rounded
    one dtype at a time.
    """
    for group in _by_dtype(grads):
        views = [g.permute(0, 2, 3, 1) if is_channels_last(g) else g for g in group]
        flat = torch.cat([v.reshape(-1) for v in views])
        out = fmt.round(flat)
        if out is flat:  # already in the format: nothing to write back
            continue
        for v, piece in zip(views, out.split([v.numel() for v in views])):
            v.copy_(piece.view(v.shape))


def _by_dtype(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``grads`` grouped by dtype, in order: one concatenated rounding call per dtype."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault(g.dtype, []).append(g)
    return list(groups.values())


def round_block_grads_(fmt: FloatFormat, grads: list[torch.Tensor]) -> None:
    """Round ``grads`` in place to a block format whose blocks are consecutive elements of the
    flattened tensor (``fmt.concat_block``, mx32), with one rounding call.

    Each gradient is flattened in logical order (the order its blocks follow) and zero-padded to a
    whole number of blocks, so no block holds elements of two tensors and a padded tail block has the
    amax its ragged tail had (``block_scaling`` pads the same way): bit for bit the values a call per
    tensor gives (tested), for ssd_tiny's 48 parameters one call instead of 48.
    """
    block = fmt.concat_block
    if block is None:
        raise ValueError(f"{fmt.name}: its blocks are not consecutive flat elements; round one tensor at a time")
    for group in _by_dtype(grads):
        sizes = [g.numel() for g in group]
        flat = torch.cat([torch.nn.functional.pad(g.reshape(-1), (0, -n % block)) for g, n in zip(group, sizes)])
        out = fmt.round(flat)
        start = 0
        for g, n in zip(group, sizes):
            g.copy_(out[start:start + n].view(g.shape))
            start += n + (-n % block)


install_fp16_emulation = partial(install_emulation, forward_format=FP16, grad_format=FP16)
install_fp16_emulation.__doc__ = "Round layer outputs, their incoming gradients and parameter gradients to fp16."


@dataclass(frozen=True)
class Precision:
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

    @property
    def rounds_after_unscale(self) -> bool:
        """Whether the loop must unscale every step and then call :meth:`round_unscaled_grads`."""
        return self.emulated and self.grad_rounding == "after_unscale"

    def prepare(self, model: nn.Module) -> EmulationHandle | None:
        """Install whatever the precision needs on the model (the emulation's rounding hooks)."""
        if self.emulated:
            return install_emulation(model, self.forward_format, self.grad_format,
                                     round_param_grads=not self.rounds_after_unscale,
                                     weight_format=self.weight_format, wgrad_hadamard=self.wgrad_hadamard)
        return None

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
        grad = fp4_format(spec.grad_scaling or "e2m1", stochastic=opts["fp4_rounding"] == "stochastic",
                          mode=opts["mx_exponent"], seed=seed)
    if spec.forward_scaling == "nvfp4":  # forward values are rounded to nearest (NVIDIA's recipe)
        fwd, weight = fp4_format("nvfp4"), fp4_format("nvfp4", weight=True)
    return Precision(spec.name, getattr(torch, spec.autocast) if spec.autocast else None,
                     needs_scaler=spec.needs_scaler, emulated=spec.emulated, forward_format=fwd, grad_format=grad,
                     weight_format=weight, wgrad_hadamard=bool(opts["wgrad_hadamard"]))


def get_precision(name: str, grad_rounding: str | None = None, grad_overflow: str | None = None,
                  grad_blocks: str | None = None, block_rounding: str | None = None, seed: int = 0,
                  **options) -> Precision:
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


def _with_grad_format(name: str, grad_overflow, grad_blocks, block_rounding, seed: int = 0,
                      options: dict | None = None) -> Precision:
    try:
        prec = _build(name, seed, options)
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; allowed: {', '.join(PRECISIONS)}") from None
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
