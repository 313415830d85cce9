"""Adaptive layer-wise loss scaling (Zhao et al. 2019), for unmodified PyTorch models.

The algorithm is the one in ``/work/shared/ADAPTIVE.md`` (method
``approx_range``, the authors' default). Usage is GradScaler's::

    scaler = AdaptiveLossScaler(model)            # after precision.prepare(model)
    scaler.scale(loss).backward()
    result = scaler.step(optimizer)               # StepResult(skipped, scale, overflow)
    scaler.update()
    ...
    scaler.remove()                               # model restored exactly

Design
------
*Per-layer scaling.* Every ``nn.Conv2d`` and ``nn.Linear`` whose class uses
the stock ``forward`` gets an instance ``forward`` (a bound method; removed by
``remove()``) that runs a custom ``autograd.Function``. Its backward receives
the gradient ``g`` arriving at the layer output (carrying the accumulated
scale ``P``), computes the layer scale ``s`` on the device (steps 1-9 of
ADAPTIVE.md, :func:`approx_range_scale_tensor`), and computes the input
gradient scaled by ``s`` and the weight/bias gradients from ``g`` (scale
``P``). ``s`` is folded into the weight operand: ``conv_T(g, s*W)`` equals
``conv_T(s*g, W)`` (bit for bit with power-of-two scales, unless ``s*W``
over/underflows, which weights times ``s <= 16`` do not; with ``s < 1`` it
loses less than scaling tiny gradients down would). That spares a pass over
the large gradient tensor and lets one ``aten.convolution_backward`` call
(input, weight and bias masks) do what plain autograd does; Linear uses
matmuls. Forward hooks of other code (``install_fp16_emulation``) still wrap
the patched ``forward``, so the order in which emulation and scaler are
installed does not matter: the gradient reaching the Function is already
rounded to fp16, as a real fp16 gradient would be, and the weight gradient
leaves it still carrying ``P``, so that the emulation's post-accumulate hook
(or, under autocast, the fp16 computation itself) rounds the *scaled* value,
as in real mixed precision.
A module instance patch, rather than a module transform, is what lets the
method apply to torchvision's SSDs and ResNets unchanged; a custom Function
rather than ``register_full_backward_hook`` because the latter breaks with
the in-place ReLUs those models use (FIELD-NOTES "Hooks").

*Where the scales go.* A scale travels with a gradient, but autograd does not
carry metadata with gradients. So ``scale(loss)`` walks the loss's graph once
(``_graph.analyse``: a Python walk over next_functions, a few hundred nodes for
an SSD300 and well under a millisecond to a few ms) and assigns every node the
symbolic *scale source* of the gradient it will receive: the loss
(``init_scale``), the input gradient of a scaling layer (``P*s``), or a merge.
A node whose consumer edges carry different sources (a VGG feature map read by
the next block and by two multibox heads; a residual input read by the block
and the shortcut; anything) is a merge point: a post-hook on each consumer
stashes that branch's gradient and returns ``None`` for the edge, and the
last branch to arrive returns ``sum_i g_i * (t / scale_i)`` with the common
target ``t`` of ADAPTIVE.md "Branches" (computed on the device). Passing
nodes (BN, ReLU, pooling, concat, reshape, the SSD loss) need nothing; every
parameter leaf (``AccumulateGrad``) learns the scale its gradient carries, so
BN's gamma/beta or the VGG L2Norm ``scale_weight`` are unscaled like conv
weights. Scale values are 0-d fp32 device tensors filled in during backward,
in topological order, so no host synchronisation happens per layer: the only
sync of a step is the overflow flag read in ``step()``.

*Unscaling.* Parameter gradients stay scaled (by their own ``P``) in ``.grad``
until ``unscale_``, which multiplies each group of gradients sharing a scale
by ``1/P`` with the fused non-finite check GradScaler uses (one flag, one host
read). Data parallelism as this project's loop does it (each replica unscales
its own gradients, then they are averaged) needs nothing more: replicas may
use different layer scales. A model wrapped in ``DistributedDataParallel``
(or ``unscale_in_backward=True``) is different: DDP averages ``.grad`` during
backward, while replicas' ``P`` may differ, so there the gradients are divided
by ``P`` before they are accumulated (that gradient rounding then happens on
unscaled values under fp16 emulation). With ``update_every > 1`` each layer's
last *unbounded* scale is reused (bounds and the power-of-two step still
applied, with the current ``P``); when ``torch.distributed`` is initialised,
the stacked unbounded scales are all-reduced with MIN after each recompute
step (:meth:`AdaptiveLossScaler.agree_scales`: one tiny collective, skipped
with ``update_every == 1`` and a no-op when not distributed), so replicas use
the same layer scales until the next recompute.

Deviations from the Chainer reference (all documented in ADAPTIVE.md's terms)
------------------------------------------------------------------------------
* ``sigma_g**2 + mu_g**2`` is computed as the mean of squares (the identity
  holds for the population std numpy uses); one reduction instead of two.
* ``2**floor(log2(s))`` is taken with ``frexp`` (exact), because fp32 ``log2``
  rounds values just below a power of two up to it.
* Accumulated scales ``P`` are kept in fp32 (the reference multiplies them in
  fp16); the layer scales themselves are stored as fp16 values (step 9).
* Non-finite statistics (an inf/NaN gradient) give an unbounded scale of 1
  instead of raising; the non-finite gradient then skips the step as usual and
  does not poison the scale stored for ``update_every`` reuse.
* Branch merge: ``m`` is the maximum of the *unscaled* branch gradients, as
  ADAPTIVE.md says (the Chainer code multiplies an already-scaled maximum by
  the candidate scale). If no candidate fits even at 1/8 the target is 1/8
  and the overflow skips the step, where the reference raises.
* Layers whose input needs no gradient (the first conv) compute no statistics:
  their scale would multiply nothing. ``layer_table`` marks them
  ``applied: False``.
* ``update_every`` counts optimizer steps (``update()`` calls); the reference
  counts backward passes, the same with one backward per step. Several
  backward passes in one step (gradient accumulation) are supported: later
  passes convert their parameter gradients to the scale the first pass left.

Limits
------
Double backward (``create_graph=True``), reentrant activation checkpointing
and ``torch.compile``/TorchScript of the patched modules are not supported.
One ``scale()`` per backward: scaling two losses separately and
back-propagating their sum is not supported (both graphs share the
parameters' gradient accumulators, where autograd would add gradients of
different scales before any hook sees them); scale the summed loss instead.
Use ``.backward()``, not ``torch.autograd.grad`` with ``inputs`` (pruned
branches would never arrive at a merge). Leaf tensors outside the optimizer
that require grad keep scaled gradients. A merge holds its branches'
gradients until the last arrives (autograd would have summed them at once):
a little more peak memory at merge points. Modules
other than stock Conv2d/Linear (ConvTranspose2d, subclasses with their own
forward) pass the scale through unchanged: correct, just not rescaled.
Deep-copying or pickling a model while attached yields a copy that runs
unpatched (a new scaler can attach to it).
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
import warnings
import weakref
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..formats import FP16, FloatFormat
from ._graph import ROOT_SCALE_ID, analyse
from .base import LossScaler, all_reduce_flag

__all__ = ["AdaptiveLossScaler", "approx_range_scale", "approx_range_scale_tensor", "unbounded_scale_tensor",
           "bound_scale_tensor", "branch_target_scale", "backward_fan_in", "U_MIN", "U_MAX"]

#: fp16's smallest subnormal, as the reference uses it (the default ``u_min``; other gradient
#: formats bring their own, see ``AdaptiveLossScaler(grad_format=...)``)
U_MIN = FP16.u_min
#: fp16's largest finite value (the default ``u_max``)
U_MAX = FP16.u_max
#: branch merges halve the smallest branch scale down to this
MIN_BRANCH_SCALE = 0.125

_F32 = torch.float32


# ---------------------------------------------------------------------------
# the per-layer scale (ADAPTIVE.md steps 1-9)
@functools.lru_cache(maxsize=None)
def underflow_k(n_uf_threshold: float) -> float:
    """``k = sqrt(2) * erfinv(T)``: with T = 1e-3, k ~= 1.2533e-3."""
    if not 0.0 < n_uf_threshold < 1.0:
        raise ValueError(f"n_uf_threshold must be in (0, 1), got {n_uf_threshold}")
    return math.sqrt(2.0) * float(torch.erfinv(torch.tensor(n_uf_threshold, dtype=torch.float64)))


def backward_fan_in(weight: torch.Tensor) -> int:
    """Fan-in of the backward product: Linear ``out_features``; conv ``out_channels * kh * kw``."""
    if weight.dim() == 2:
        return int(weight.shape[0])
    return int(weight.shape[0] * math.prod(weight.shape[2:]))


def unbounded_scale_tensor(grad: torch.Tensor, weight: torch.Tensor, *, n_uf_threshold: float = 1e-3,
                           fan_in: int | None = None, u_min: float = U_MIN, u_max: float = U_MAX) -> torch.Tensor:
    """Steps 1-6: the statistical scale before the heuristic bounds, a 0-d fp32 tensor on grad's device.

    ``u_min``/``u_max`` are the gradient format's range (the reference's ``get_range(dtype)``):
    fp16's by default, E5M2's (2**-16, 57344) under ``fp8-emulated``.

    Never synchronises with the host (no ``.item()``, no data-dependent Python branch).
    """
    if fan_in is None:
        fan_in = backward_fan_in(weight)
    g = grad.detach()
    w = weight.detach().to(g.device)
    if g.numel() == 0 or w.numel() == 0:
        return torch.ones((), dtype=_F32, device=g.device)
    # steps 1-2: sigma_o = sqrt((sigma_g^2 + mu_g^2)(sigma_W^2 + mu_W^2)), i.e. sqrt(E[g^2] E[W^2])
    rms_g = torch.linalg.vector_norm(g, dtype=_F32) / math.sqrt(g.numel())
    rms_w = torch.linalg.vector_norm(w, dtype=_F32) / math.sqrt(w.numel())
    sigma_o = rms_g * rms_w * math.sqrt(0.5 * fan_in)  # step 3
    # step 6's operands: signed extremes of the raw tensors
    g_min, g_max = torch.aminmax(g)
    w_min, w_max = torch.aminmax(w)
    g_min, g_max, w_min, w_max = (v.to(_F32) for v in (g_min, g_max, w_min, w_max))
    o_max = torch.stack([g_max * w_max, g_min * w_min, g_max * w_min, g_min * w_max]).abs().amax()
    # step 5: underflow scale, never below 1
    s = (u_min / (underflow_k(n_uf_threshold) * sigma_o)).clamp(min=1.0)
    # step 6: overflow cap
    s = torch.minimum(s, (u_max / fan_in) / o_max)
    # step 4 (sigma_o == 0 -> 1), and non-finite statistics -> 1 (see module doc)
    ok = (sigma_o > 0) & torch.isfinite(sigma_o) & torch.isfinite(o_max)
    return torch.where(ok, s, torch.ones_like(s))


def _max_abs(t: torch.Tensor) -> torch.Tensor:
    """``max|t|`` as a 0-d fp32 tensor, one pass (aminmax; CPU's inf-norm reduction is far slower)."""
    if t.numel() == 0:
        return torch.zeros((), dtype=_F32, device=t.device)
    lo, hi = torch.aminmax(t.detach())
    return torch.maximum(lo.abs(), hi.abs()).to(_F32)


def _floor_pow2(s: torch.Tensor) -> torch.Tensor:
    _, e = torch.frexp(s)
    p = torch.ldexp(torch.ones_like(s), e - 1)
    return torch.where((s > 0) & torch.isfinite(s), p, s)


def bound_scale_tensor(unbounded: torch.Tensor, prev_scale: torch.Tensor | float = 1.0, *,
                       scale_upper_bound: float = 16.0, accum_upper_bound: float = 1024.0,
                       power_of_two: bool = True) -> torch.Tensor:
    """Steps 7-9: heuristic bounds, power of two, fp16 storage. ``prev_scale`` is ``P``."""
    unbounded = unbounded.to(_F32)
    if not isinstance(prev_scale, torch.Tensor):
        prev_scale = torch.full((), float(prev_scale), dtype=_F32, device=unbounded.device)
    s = torch.minimum(unbounded, accum_upper_bound / prev_scale.to(device=unbounded.device, dtype=_F32))
    s = s.clamp(max=scale_upper_bound)
    if power_of_two:
        s = _floor_pow2(s)
    return s.to(torch.float16).to(_F32)


def approx_range_scale_tensor(grad: torch.Tensor, weight: torch.Tensor, prev_scale: torch.Tensor | float = 1.0, *,
                              n_uf_threshold: float = 1e-3, scale_upper_bound: float = 16.0,
                              accum_upper_bound: float = 1024.0, power_of_two: bool = True,
                              grad_format: FloatFormat = FP16) -> torch.Tensor:
    """ADAPTIVE.md steps 1-9 as a 0-d fp32 device tensor (no host sync)."""
    unb = unbounded_scale_tensor(grad, weight, n_uf_threshold=n_uf_threshold, u_min=grad_format.u_min,
                                 u_max=grad_format.u_max)
    return bound_scale_tensor(unb, prev_scale, scale_upper_bound=scale_upper_bound,
                              accum_upper_bound=accum_upper_bound, power_of_two=power_of_two)


def approx_range_scale(grad: torch.Tensor, weight: torch.Tensor, prev_scale: float = 1.0, *,
                       n_uf_threshold: float = 1e-3, scale_upper_bound: float = 16.0,
                       accum_upper_bound: float = 1024.0, power_of_two: bool = True,
                       grad_format: FloatFormat = FP16) -> float:
    """The layer scale of ADAPTIVE.md (steps 1-9) for gradient ``grad`` at a layer with ``weight``.

    ``grad``: Linear ``(N, out)`` (or ``(*, out)``), Conv2d ``(N, Cout, H, W)``;
    ``weight``: ``(out, in)`` or ``(Cout, Cin/groups, kh, kw)``; ``prev_scale``: the
    accumulated scale ``P`` the gradient already carries; ``grad_format``: the format whose
    range the gradient must stay in.
    """
    return float(approx_range_scale_tensor(grad, weight, prev_scale, n_uf_threshold=n_uf_threshold,
                                           scale_upper_bound=scale_upper_bound,
                                           accum_upper_bound=accum_upper_bound, power_of_two=power_of_two,
                                           grad_format=grad_format))


def branch_target_scale(max_abs: torch.Tensor, scales: torch.Tensor, u_max: float = U_MAX) -> torch.Tensor:
    """The common scale ``t`` of merging branches (ADAPTIVE.md "Branches"), on the device.

    ``max_abs[i]`` is ``max|g_i|`` of branch i (scaled, as it arrives), ``scales[i]``
    its scale. ``m = max_i(max_abs[i] / scales[i])``; ``t`` is the largest branch
    scale with ``m*t < U_MAX``, else ``min(scales)`` halved until it fits, not below
    1/8 (where nothing fits the overflow is left to the non-finite check).
    """
    scales = scales.to(_F32)
    m = (max_abs.to(_F32) / scales).amax()
    fits = m * scales < u_max
    best = torch.where(fits, scales, torch.zeros_like(scales)).amax()
    mn = scales.amin()
    # smallest j >= 1 with m * mn * 2^-j < u_max
    j = (torch.floor(torch.log2(mn * m / u_max)) + 1).clamp(min=1.0)
    j = torch.where(torch.isfinite(j), j, torch.ones_like(j))
    halved = torch.maximum(mn * torch.exp2(-j), torch.full_like(mn, MIN_BRANCH_SCALE))
    fallback = torch.where(mn >= MIN_BRANCH_SCALE, halved, mn)
    return torch.where(fits.any(), best, fallback)


# ---------------------------------------------------------------------------
# the layers' autograd Functions
class _LayerInfo:
    """Per wrapped module: geometry and the scales it recorded (device tensors)."""

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name = name
        self.kind = type(module).__name__
        self.is_conv = isinstance(module, nn.Conv2d)
        self.fan_in = backward_fan_in(module.weight)
        self.last_unbounded: torch.Tensor | None = None
        self.last_scale: torch.Tensor | None = None
        self.last_prev: torch.Tensor | None = None
        self.applied = False
        if self.is_conv:
            self.stride = tuple(module.stride)
            self.dilation = tuple(module.dilation)
            self.groups = module.groups
            self.prepad: tuple[int, ...] | None = None
            self.prepad_mode = "constant"
            if module.padding_mode != "zeros":
                self.prepad = tuple(module._reversed_padding_repeated_twice)
                self.prepad_mode = module.padding_mode
                self.padding = (0, 0)
            elif isinstance(module.padding, str):
                if module.padding == "valid":
                    self.padding = (0, 0)
                else:  # 'same': torch pads the extra pixel at the end
                    pads = []
                    for d, k in zip(self.dilation, module.kernel_size):
                        total = d * (k - 1)
                        pads.append((total // 2, total - total // 2))
                    if all(a == b for a, b in pads):
                        self.padding = tuple(a for a, _ in pads)
                    else:
                        self.padding = (0, 0)
                        self.prepad = tuple(v for a, b in reversed(pads) for v in (a, b))
            else:
                self.padding = tuple(module.padding)

    def record(self, scale: torch.Tensor | None, prev: torch.Tensor) -> None:
        self.last_prev = prev
        self.last_scale = scale
        self.applied = scale is not None


def _autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    dev = t.device.type
    try:
        if torch.is_autocast_enabled(dev) and t.is_floating_point() and t.dtype != torch.float64:
            return torch.get_autocast_dtype(dev)
    except (RuntimeError, TypeError):  # device type without autocast support
        return None
    return None


def _cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    if t is None or dtype is None or t.dtype == dtype:
        return t
    return t.to(dtype)


def _input_grad_weight(ctx, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The weight operand of the input-gradient product: ``s*W`` when a plan is attached, else ``W``.

    ``conv_T(g, s*W) == s * conv_T(g, W) == conv_T(s*g, W)`` (exactly for powers of two); folding
    ``s`` into the small weight spares a pass over the large gradient and lets one
    ``convolution_backward`` call produce the input, weight and bias gradients (the weight and
    bias gradients do not read the weight), as plain autograd does.
    """
    plan = getattr(ctx, "_ada", None)
    if plan is None:
        return w
    it, in_id, out_id = plan
    s = it.layer_backward(ctx.info, g, w, in_id, out_id, ctx.needs_input_grad[0])
    return w if s is None else w * s


def _forward_as_autocast_would(op, x, weight, bias):
    """Cast inputs to the active autocast dtype (if any) and run ``op`` with autocast off, so the
    custom Function computes in the dtype the stock layer would; returns the cast inputs too."""
    dt = _autocast_dtype(x)
    x_c, w_c, b_c = _cast(x, dt), _cast(weight, dt), _cast(bias, dt)
    if dt is not None:
        with torch.autocast(x.device.type, enabled=False):
            return x_c, w_c, b_c, op(x_c, w_c, b_c)
    return x_c, w_c, b_c, op(x_c, w_c, b_c)


class _AdaConv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, info):  # type: ignore[override]
        x_c, w_c, b_c, out = _forward_as_autocast_would(
            lambda a, w, b: F.conv2d(a, w, b, info.stride, info.padding, info.dilation, info.groups), x, weight, bias)
        ctx.save_for_backward(x_c, w_c)
        ctx.info = info
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.bias_sizes = None if bias is None else [bias.shape[0]]
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        x, w = ctx.saved_tensors
        info = ctx.info
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = bool(need_b and ctx.bias_sizes is not None)
        w_in = _input_grad_weight(ctx, g, w)
        if not (need_x or need_w or need_b):
            return None, None, None, None
        gx, gw, gb = torch.ops.aten.convolution_backward(
            g, x, w_in, ctx.bias_sizes if need_b else None, info.stride, info.padding, info.dilation, False,
            [0, 0], info.groups, [bool(need_x), bool(need_w), need_b])
        return (_cast(gx, ctx.dtypes[0]) if need_x else None, _cast(gw, ctx.dtypes[1]) if need_w else None,
                _cast(gb, ctx.dtypes[2]) if need_b else None, None)


class _AdaLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, info):  # type: ignore[override]
        x_c, w_c, b_c, out = _forward_as_autocast_would(F.linear, x, weight, bias)
        ctx.save_for_backward(x_c, w_c)
        ctx.info = info
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        w_in = _input_grad_weight(ctx, g, w)
        gx = gw = gb = None
        if need_x:
            gx = _cast(g.matmul(w_in), ctx.dtypes[0])
        g2 = g.reshape(-1, g.shape[-1])
        if need_w:
            gw = _cast(g2.t().matmul(x.reshape(-1, x.shape[-1])), ctx.dtypes[1])
        if need_b and ctx.has_bias:
            gb = _cast(g2.sum(0), ctx.dtypes[2])
        return gx, gw, gb, None


_SCALING_NODE_TYPES = (_AdaConv2d._backward_cls, _AdaLinear._backward_cls)  # type: ignore[attr-defined]

#: module -> _LayerInfo of the scaler attached to it (a copied module is not in here: it runs unpatched)
_ATTACHED: "weakref.WeakKeyDictionary[nn.Module, _LayerInfo]" = weakref.WeakKeyDictionary()


class _PatchedForward:
    """The instance ``forward`` of a wrapped Conv2d/Linear.

    A callable object rather than a bound method so that a model can be deep-copied
    or pickled while attached: the copy carries a ``_PatchedForward`` of its own
    module, which is not in ``_ATTACHED`` and therefore runs the class forward.
    """

    __slots__ = ("module",)

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, input: torch.Tensor) -> torch.Tensor:
        return _ada_forward(self.module, input)

    def __reduce__(self):
        return (_PatchedForward, (self.module,))


def _is_ours(forward: Any) -> bool:
    return isinstance(forward, _PatchedForward)


def _ada_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    info = _ATTACHED.get(self)
    cls_forward = type(self).forward
    if info is None or not torch.is_grad_enabled():
        return cls_forward(self, input)
    weight, bias = self.weight, self.bias
    if not (input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        return cls_forward(self, input)
    if info.is_conv:
        if info.prepad is not None:
            mode = info.prepad_mode
            input = F.pad(input, info.prepad, mode=mode) if mode != "constant" else F.pad(input, info.prepad)
        return _AdaConv2d.apply(input, weight, bias, info)
    return _AdaLinear.apply(input, weight, bias, info)


# ---------------------------------------------------------------------------
# one backward pass
class _Merge:
    __slots__ = ("out_id", "ids", "stash", "order")

    def __init__(self, out_id: int, ids: list[int]) -> None:
        self.out_id = out_id
        self.ids = ids
        self.stash: list[torch.Tensor | None] = [None] * len(ids)
        #: slots in arrival order: the sum follows it, as autograd's own accumulation would
        self.order: list[int] = []


class _Iteration:
    """State of one ``scale(loss)``/backward: the scale values, indexed by scale source id."""

    def __init__(self, scaler: "AdaptiveLossScaler", n_ids: int, root_scale: torch.Tensor, recompute: bool) -> None:
        self.scaler = scaler
        self.vals: list[torch.Tensor | None] = [None] * n_ids
        self.vals[ROOT_SCALE_ID] = root_scale
        self.recompute = recompute
        self.merges: list[_Merge] = []
        #: hooks on this iteration's graph nodes (removed by the next scale() once a backward ran, or update())
        self.handles: list[Any] = []
        self.backward_done = False
        #: merges may see branches from several device threads (model parallel)
        self.lock = threading.Lock()

    def release(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()
        for m in self.merges:  # a backward that failed half-way must not leave gradients stashed
            m.stash = [None] * len(m.ids)
            m.order = []

    def on_backward_start(self, grad_outputs):
        """Pre-hook of the root node: have the engine mark the end of this backward."""
        torch.autograd.Variable._execution_engine.queue_callback(self._mark_done)
        return None

    def _mark_done(self) -> None:
        self.backward_done = True
        for m in self.merges:
            m.stash = [None] * len(m.ids)
            m.order = []

    # called from the layers' backward
    def layer_backward(self, info: _LayerInfo, g: torch.Tensor, w: torch.Tensor, in_id: int, out_id: int,
                       need_input_grad: bool) -> torch.Tensor | None:
        """The layer scale ``s`` (0-d fp32 tensor), or None when no input gradient is needed."""
        prev = self.vals[in_id]
        if not need_input_grad:  # nothing upstream to scale
            self.vals[out_id] = prev
            info.record(None, prev)
            return None
        s = self.scaler._layer_scale(self, info, g, w, prev)
        self.vals[out_id] = prev * s
        info.record(s, prev)
        return s

    # called from the merge post-hooks
    def arrive(self, mi: int, slot: int, g: torch.Tensor | None) -> torch.Tensor | None:
        m = self.merges[mi]
        with self.lock:
            m.stash[slot] = g
            m.order.append(slot)
            if len(m.order) < len(m.ids):
                return None
        try:
            return self._combine(m)
        finally:
            m.stash = [None] * len(m.ids)
            m.order = []

    def _combine(self, m: _Merge) -> torch.Tensor | None:
        scales = torch.stack([self.vals[sid] for sid in m.ids])
        live = [(m.stash[k], self.vals[m.ids[k]]) for k in m.order if m.stash[k] is not None]
        if not live:
            self.vals[m.out_id] = scales.amax()
            return None
        # every branch scale is a candidate, also those of branches whose gradient is None (zero)
        zero = torch.zeros((), dtype=_F32, device=scales.device)
        max_abs = torch.stack([zero if g is None else _max_abs(g) for g in m.stash])
        t = branch_target_scale(max_abs, scales, self.scaler.grad_format.u_max)
        self.vals[m.out_id] = t
        dtype = functools.reduce(torch.promote_types, (g.dtype for g, _ in live))
        total = None
        for g, s in live:
            factor = t / s
            if total is None:
                total = g.to(dtype) * factor
            else:
                total.addcmul_(g.to(dtype), factor)
        return total


def _merge_hook(it: _Iteration, entries: list[tuple[int, int, int]]):
    def hook(grad_inputs, grad_outputs):
        gi = list(grad_inputs)
        for j, mi, slot in entries:
            gi[j] = it.arrive(mi, slot, gi[j])
        return tuple(gi)

    return hook


def _convert_hook(it: _Iteration, x_id: int, target: tuple[_Iteration, int] | None):
    """Pre-hook of a parameter's AccumulateGrad: bring its gradient from scale ``x_id`` to ``target``."""

    def hook(grad_outputs):
        g = grad_outputs[0]
        if g is None:
            return None
        x = it.vals[x_id]
        if x is None:
            return None
        c = 1.0 if target is None else target[0].vals[target[1]]
        return (g * (c / x).to(g.device),) + tuple(grad_outputs[1:])

    return hook


def _world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


_UNSCALED = None  # marker in AdaptiveLossScaler._carried: the gradient is accumulated unscaled


class AdaptiveLossScaler(LossScaler):
    """Adaptive layer-wise loss scaling on an unmodified model (see module doc).

    Options as in ADAPTIVE.md. Keyword-only extras: ``sync_scales`` (all-reduce MIN
    of recomputed unbounded scales when distributed and ``update_every > 1``),
    ``unscale_in_backward`` (None: only for a model wrapped in DDP), ``scale_fn``
    (test hook: ``fn(layer_name, grad, weight, prev_scale) -> scale`` replaces
    steps 1-9), ``layer_types`` (a subset of Conv2d/Linear to scale), ``grad_format`` (the
    gradients' format, :mod:`lossscale_bench.formats`; fp16 by default, E5M2 under
    ``fp8-emulated``: ``u_min``/``u_max`` of steps 5-6 and of branch merges come from it, as the
    reference's ``get_range(dtype)``).
    """

    method = "adaptive"

    def __init__(self, model: nn.Module, update_every: int = 1, init_scale: float = 1.0,
                 n_uf_threshold: float = 1e-3, scale_upper_bound: float = 16.0,
                 accum_upper_bound: float = 1024.0, power_of_two: bool = True, *,
                 sync_scales: bool = True, unscale_in_backward: bool | None = None,
                 scale_fn: Callable[[str, torch.Tensor, torch.Tensor, torch.Tensor], Any] | None = None,
                 layer_types: tuple[type, ...] = (nn.Conv2d, nn.Linear), grad_format: FloatFormat = FP16) -> None:
        super().__init__()
        if model is None:
            raise ValueError("adaptive loss scaling needs the model")
        if int(update_every) != update_every or update_every < 1:
            raise ValueError(f"update_every must be a positive integer, got {update_every}")
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        if not (scale_upper_bound > 0 and accum_upper_bound > 0):
            raise ValueError("scale_upper_bound and accum_upper_bound must be > 0")
        underflow_k(n_uf_threshold)  # validates
        self.update_every = int(update_every)
        self.init_scale = float(init_scale)
        self.n_uf_threshold = float(n_uf_threshold)
        self.scale_upper_bound = float(scale_upper_bound)
        self.accum_upper_bound = float(accum_upper_bound)
        self.power_of_two = bool(power_of_two)
        self.sync_scales = bool(sync_scales)
        self.scale_fn = scale_fn
        #: the format the gradients live in: its range is the rule's [u_min, u_max]
        self.grad_format = grad_format
        is_ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        self.unscale_in_backward = is_ddp if unscale_in_backward is None else bool(unscale_in_backward)
        if is_ddp:
            model = model.module
        self._model: nn.Module | None = model
        self._layers: list[_LayerInfo] = []
        self._modules: list[nn.Module] = []
        self._by_name: dict[str, _LayerInfo] = {}
        #: (name, reason) of matching modules left unwrapped (they pass the scale through)
        self.skipped_layers: list[tuple[str, str]] = []
        stock = {nn.Conv2d: nn.Conv2d.forward, nn.Linear: nn.Linear.forward}
        for name, mod in model.named_modules():
            if not isinstance(mod, layer_types) or not isinstance(mod, (nn.Conv2d, nn.Linear)):
                continue
            if _ATTACHED.get(mod) is not None:
                self._detach_modules()
                raise ValueError(f"module {name!r} already has an adaptive loss scaler attached")
            base = nn.Conv2d if isinstance(mod, nn.Conv2d) else nn.Linear
            if type(mod).forward is not stock[base]:
                self.skipped_layers.append((name, "class overrides forward"))
                continue
            if "forward" in mod.__dict__ and not _is_ours(mod.__dict__["forward"]):  # ours: a stale copy
                self.skipped_layers.append((name, "instance forward already patched"))
                continue
            info = _LayerInfo(name or type(mod).__name__, mod)
            _ATTACHED[mod] = info
            mod.forward = _PatchedForward(mod)
            self._layers.append(info)
            self._modules.append(mod)
            self._by_name[info.name] = info
        if self.skipped_layers:
            warnings.warn(f"adaptive loss scaling leaves {len(self.skipped_layers)} layer(s) unscaled: "
                          f"{self.skipped_layers[:3]}", stacklevel=2)

        self._iter = 0
        #: iterations whose hooks may still be registered (normally only the current one)
        self._pending: list[_Iteration] = []
        self._recomputed = False
        #: id(param) -> (iteration, scale id) whose value the param's .grad carries, or _UNSCALED
        self._carried: dict[int, tuple[_Iteration, int] | None] = {}
        #: number of statistics computations (steps 1-6) since construction
        self.stat_computations = 0
        self._last_plan = {"nodes": 0, "merge_points": 0, "layers": 0}

    # -- the loop's interface ------------------------------------------------
    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        if self._model is None:
            raise RuntimeError("scaler was removed from its model")
        # hooks of a finished backward go now: a parameter's AccumulateGrad node can outlive its graph
        for it in self._pending:
            if it.backward_done:
                it.release()
        self._pending = [it for it in self._pending if it.handles]
        scaled = loss * self.init_scale if self.init_scale != 1.0 else loss
        root = scaled.grad_fn
        if root is None:
            return scaled
        plan = analyse(root, lambda n: isinstance(n, _SCALING_NODE_TYPES))
        recompute = self._iter % self.update_every == 0
        self._recomputed |= recompute
        it = _Iteration(self, plan.n_ids, torch.full((), self.init_scale, dtype=_F32, device=loss.device), recompute)
        it.handles.append(root.register_prehook(it.on_backward_start))
        for node, in_id, out_id in plan.layers:
            node._ada = (it, in_id, out_id)
        consumers: dict[int, tuple[Any, list[tuple[int, int, int]]]] = {}
        for spec in plan.merges:
            mi = len(it.merges)
            it.merges.append(_Merge(spec.out_id, [sid for _, _, sid in spec.edges]))
            for slot, (cnode, j, _) in enumerate(spec.edges):
                consumers.setdefault(id(cnode), (cnode, []))[1].append((j, mi, slot))
        for cnode, entries in consumers.values():
            entries.sort()
            it.handles.append(cnode.register_hook(_merge_hook(it, entries)))
        unscaled_mode = self.unscale_in_backward
        for acc, var, sid in plan.leaves:
            key = id(var)
            if key not in self._carried:
                self._carried[key] = _UNSCALED if unscaled_mode else (it, sid)
            target = self._carried[key]
            if target is not None and target[0] is it and target[1] == sid:
                continue
            it.handles.append(acc.register_prehook(_convert_hook(it, sid, target)))
        self._last_plan = {"nodes": plan.n_nodes, "merge_points": len(plan.merges), "layers": len(plan.layers)}
        self._pending.append(it)
        return scaled

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide each parameter gradient by the scale it carries; one fused non-finite check per group."""
        if self._unscaled:
            return
        groups: dict[tuple, tuple[torch.Tensor | None, list[torch.Tensor]]] = {}
        for g, p in ((p.grad, p) for group in optimizer.param_groups for p in group["params"]):
            if g is None:
                continue
            target = self._carried.get(id(p))
            val = None if target is None else target[0].vals[target[1]]
            key = (id(val) if val is not None else None, g.device, g.dtype)
            groups.setdefault(key, (val, []))[1].append(g)
        found_by_dev: dict[torch.device, torch.Tensor] = {}
        for (_, device, _), (val, grads) in groups.items():
            found = found_by_dev.setdefault(device, torch.zeros(1, dtype=_F32, device=device))
            if val is None:
                inv = torch.ones(1, dtype=_F32, device=device)
            else:
                inv = torch.reciprocal(val.to(device=device, dtype=_F32)).reshape(1)
                found.add_((~torch.isfinite(inv)).to(_F32))
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        if found_by_dev:
            flags = list(found_by_dev.values())
            dev = flags[0].device
            found = torch.stack([f.to(dev) for f in flags]).amax().clamp(max=1.0)
        else:
            found = torch.zeros(())
        self._found_inf = all_reduce_flag(found)
        self._unscaled = True

    def update(self) -> None:
        super().update()
        if self._recomputed and self.sync_scales and self.update_every > 1 and _world_size() > 1:
            self.agree_scales()
        self._recomputed = False
        self._iter += 1
        self._carried.clear()
        self._release_pending()

    def current_scale(self) -> float:
        return self.init_scale

    # -- internals -------------------------------------------------------------
    def _layer_scale(self, it: _Iteration, info: _LayerInfo, g: torch.Tensor, w: torch.Tensor,
                     prev: torch.Tensor) -> torch.Tensor:
        if self.scale_fn is not None:
            s = self.scale_fn(info.name, g, w, prev)
            return torch.as_tensor(s, dtype=_F32, device=g.device).reshape(())
        unb = info.last_unbounded
        if it.recompute or unb is None:
            unb = unbounded_scale_tensor(g, w, n_uf_threshold=self.n_uf_threshold, fan_in=info.fan_in,
                                         u_min=self.grad_format.u_min, u_max=self.grad_format.u_max)
            info.last_unbounded = unb
            self.stat_computations += 1
        elif unb.device != g.device:
            unb = info.last_unbounded = unb.to(g.device)
        return bound_scale_tensor(unb, prev, scale_upper_bound=self.scale_upper_bound,
                                  accum_upper_bound=self.accum_upper_bound, power_of_two=self.power_of_two)

    def _release_pending(self) -> None:
        for it in self._pending:
            it.release()
        self._pending = []

    def agree_scales(self) -> None:
        """All-reduce MIN of the stored unbounded layer scales across replicas (no-op when not distributed)."""
        if _world_size() <= 1 or not self._layers:
            return
        import torch.distributed as dist

        dev = next((i.last_unbounded.device for i in self._layers if i.last_unbounded is not None), None)
        if dev is None:
            dev = self._modules[0].weight.device
        if dist.get_backend() == "nccl" and dev.type != "cuda":
            dev = torch.device("cuda", torch.cuda.current_device())
        inf = torch.full((), float("inf"), dtype=_F32, device=dev)
        vec = torch.stack([i.last_unbounded.to(dev, _F32) if i.last_unbounded is not None else inf
                           for i in self._layers])
        dist.all_reduce(vec, op=dist.ReduceOp.MIN)
        for info, v in zip(self._layers, vec):
            if info.last_unbounded is not None:  # layers without statistics (no input gradient) stay so
                info.last_unbounded = torch.where(torch.isfinite(v), v, torch.ones_like(v)).to(
                    info.last_unbounded.device)

    def _detach_modules(self) -> None:
        for mod in self._modules:
            if _is_ours(mod.__dict__.get("forward")):
                del mod.__dict__["forward"]
            _ATTACHED.pop(mod, None)
        self._modules = []

    # -- introspection -------------------------------------------------------
    def _recorded(self) -> list[tuple[_LayerInfo, list[float]]]:
        """(info, [scale, prev, unbounded]) for layers that ran; one device->host copy."""
        rows = [i for i in self._layers if i.last_prev is not None]
        if not rows:
            return []
        dev = rows[0].last_prev.device
        nan = torch.full((), float("nan"), dtype=_F32, device=dev)

        def v(t):
            return nan if t is None else t.to(dev, _F32).reshape(())

        mat = torch.stack([torch.stack([v(i.last_scale), v(i.last_prev), v(i.last_unbounded)]) for i in rows])
        return list(zip(rows, mat.cpu().tolist()))

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"loss_scale": self.init_scale}
        rec = self._recorded()
        scales = [math.log2(s) for i, (s, _, _) in rec if i.applied and s > 0]
        accum = [math.log2(p * (s if i.applied else 1.0)) for i, (s, p, _) in rec
                 if p > 0 and (not i.applied or s > 0) and math.isfinite(p)]
        if scales:
            out.update(ada_scale_log2_min=min(scales), ada_scale_log2_median=float(statistics.median(scales)),
                       ada_scale_log2_max=max(scales))
        if accum:
            out.update(ada_accum_scale_log2_min=min(accum), ada_accum_scale_log2_max=max(accum))
        out["ada_merge_points"] = float(self._last_plan["merge_points"])
        return out

    def layer_table(self) -> list[dict[str, Any]]:
        vals = {i.name: r for i, r in self._recorded()}
        table = []
        for info in self._layers:
            s, p, u = vals.get(info.name, (float("nan"),) * 3)
            if info.last_unbounded is not None and info.name not in vals:
                u = float(info.last_unbounded)
            applied = info.applied and info.name in vals
            scale = s if applied else 1.0
            u = None if u is None or math.isnan(u) else u
            table.append({"layer": info.name, "type": info.kind, "fan_in": info.fan_in, "applied": applied,
                          "scale": scale, "prev_scale": p, "accum_scale": p * scale, "unbounded_scale": u})
        return table

    def state_dict(self) -> dict[str, Any]:
        rec = {i.name: r for i, r in self._recorded()}
        layers = {}
        for info in self._layers:
            s, p, _ = rec.get(info.name, (None, None, None))
            u = None if info.last_unbounded is None else float(info.last_unbounded)
            layers[info.name] = {"unbounded": u, "scale": s if info.applied else None, "prev_scale": p}
        return {"method": self.method, "iteration": self._iter, "init_scale": self.init_scale,
                "update_every": self.update_every, "layers": layers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._iter = int(state.get("iteration", 0))
        for name, rec in state.get("layers", {}).items():
            info = self._by_name.get(name)
            if info is None:
                continue
            dev = self._modules[self._layers.index(info)].weight.device
            info.last_unbounded = (None if rec.get("unbounded") is None
                                   else torch.tensor(float(rec["unbounded"]), dtype=_F32, device=dev))
            p = rec.get("prev_scale")
            s = rec.get("scale")
            info.last_prev = None if p is None else torch.tensor(float(p), dtype=_F32, device=dev)
            info.last_scale = None if (s is None or p is None) else torch.tensor(float(s), dtype=_F32, device=dev)
            info.applied = info.last_scale is not None

    @property
    def layer_names(self) -> list[str]:
        return [i.name for i in self._layers]

    def remove(self) -> None:
        """Restore the model exactly: the instance forwards go, pending hooks are removed."""
        self._detach_modules()
        self._release_pending()
        self._carried.clear()
        self._model = None
