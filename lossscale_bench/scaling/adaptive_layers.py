"""The per-layer autograd Functions of adaptive loss scaling and the state of one backward pass.

:class:`~.per_layer.PerLayerLossScaler` (adaptive's design is in :mod:`.adaptive`'s docstring) gives
every stock ``nn.Conv2d``/``nn.Linear`` an instance ``forward`` (:class:`_PatchedForward`) that
runs :class:`_AdaConv2d`/:class:`_AdaLinear`. Their backward asks the backward pass's
:class:`_Iteration` for the layer scale and folds it into the weight operand of the
input-gradient product. ``_Iteration`` holds the scale values of one ``scale(loss)``/backward,
indexed by the scale source ids of :mod:`._graph`; :meth:`_Iteration.install` hangs it on the
graph: ``node._ada = (iteration, in_id, out_id)`` on each layer's backward node (the Function
reads it back through ``ctx``, which is that node), :func:`_merge_hook` on the consumers of merge
points and :func:`_convert_hook` on parameter gradients arriving at another scale than their
``.grad`` carries. The layer scale itself is the scaler's public hook
:meth:`~.per_layer.PerLayerLossScaler.layer_factor` (adaptive: the rule of :mod:`.adaptive_rule`
with the scaler's options, or a test's ``scale_fn``); the scaler is only reached through the
iteration, so this module never imports :mod:`.per_layer` or :mod:`.adaptive`.

``_ATTACHED`` is the one registry of wrapped modules: :mod:`.per_layer` imports
this object; it must not be re-created anywhere else.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._graph import ROOT_SCALE_ID
from ..numerics.amax import max_abs_value
from .adaptive_rule import (_max_abs, backward_fan_in, branch_fallback_scale_host, branch_target_scale,
                            branch_target_scale_host)

_F32 = torch.float32

_UNSCALED = None  # marker in PerLayerLossScaler._carried: the gradient is accumulated unscaled


# ---------------------------------------------------------------------------
# the layers' autograd Functions
class _LayerInfo:
    """Per wrapped module: geometry and the scales it recorded (device tensors)."""

    #: a layer (statistics of g and W), not an output scaling point (:class:`_PointInfo`)
    is_point = False

    def __init__(self, name: str, module: nn.Module) -> None:
        #: backward calls so far (``update_count: calls``, the reference's per-layer counter)
        self.calls = 0
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


#: whether any autocast region is active (one C call); a torch without it always takes the casting path
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


class _AdaConv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, info):  # type: ignore[override]
        if _any_autocast():
            x_c, w_c, b_c, out = _forward_as_autocast_would(
                lambda a, w, b: F.conv2d(a, w, b, info.stride, info.padding, info.dilation, info.groups),
                x, weight, bias)
            ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        else:  # no cast, and the gradients come out in the inputs' dtypes (~10 us a layer less: issue 28)
            x_c, w_c = x, weight
            out = F.conv2d(x, weight, bias, info.stride, info.padding, info.dilation, info.groups)
            ctx.dtypes = None
        ctx.save_for_backward(x_c, w_c)
        ctx.info = info
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
        d = ctx.dtypes
        if d is None:
            return gx if need_x else None, gw if need_w else None, gb if need_b else None, None
        return (_cast(gx, d[0]) if need_x else None, _cast(gw, d[1]) if need_w else None,
                _cast(gb, d[2]) if need_b else None, None)


class _AdaLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, info):  # type: ignore[override]
        if _any_autocast():
            x_c, w_c, b_c, out = _forward_as_autocast_would(F.linear, x, weight, bias)
            ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        else:
            x_c, w_c = x, weight
            out = F.linear(x, weight, bias)
            ctx.dtypes = None
        ctx.save_for_backward(x_c, w_c)
        ctx.info = info
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        w_in = _input_grad_weight(ctx, g, w)
        d = ctx.dtypes or (None, None, None)
        gx = gw = gb = None
        if need_x:
            gx = _cast(g.matmul(w_in), d[0])
        g2 = g.reshape(-1, g.shape[-1])
        if need_w:
            gw = _cast(g2.t().matmul(x.reshape(-1, x.shape[-1])), d[1])
        if need_b and ctx.has_bias:
            gb = _cast(g2.sum(0), d[2])
        return gx, gw, gb, None


class _PointInfo:
    """An output scaling point (``output_scaling``): the gradient arriving at a module's output is
    scaled from its own statistics (``ada_loss_cast`` of the authors' later SSD; no weight).

    Same recording attributes as :class:`_LayerInfo`, so the scaler's tables treat both alike.
    """

    is_point = True
    fan_in = None

    def __init__(self, name: str, kind: str, lognormal: bool) -> None:
        self.name = name
        self.kind = kind
        self.lognormal = lognormal
        self.last_unbounded: torch.Tensor | None = None
        self.last_scale: torch.Tensor | None = None
        self.last_prev: torch.Tensor | None = None
        self.applied = False
        self.calls = 0

    record = _LayerInfo.record


class _AdaCast(torch.autograd.Function):
    """Identity on a module output (made fp32 under autocast, as the reference's cast to float32);
    in backward the incoming gradient (scale ``P``) is multiplied by the point's scale ``s`` and
    returned in the input's dtype, carrying ``s * P``: the scaling happens before the gradient is
    rounded to the low-precision format (by the cast back, or by the emulation's hook upstream)."""

    @staticmethod
    def forward(ctx, x, info):  # type: ignore[override]
        ctx.info = info
        ctx.in_dtype = x.dtype
        return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        plan = getattr(ctx, "_ada", None)
        if plan is None or not ctx.needs_input_grad[0]:
            return _cast(g, ctx.in_dtype), None
        it, in_id, out_id = plan
        s = it.layer_backward(ctx.info, g, None, in_id, out_id, True)
        return _cast(g * s.to(g.device), ctx.in_dtype), None


def _point_hook(info: _PointInfo):
    """Forward hook putting :class:`_AdaCast` on a module's output (training graphs only)."""

    def hook(module, inputs, output):
        if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad \
                and output.is_floating_point():
            return _AdaCast.apply(output, info)
        return output

    return hook


_SCALING_NODE_TYPES = (_AdaConv2d._backward_cls, _AdaLinear._backward_cls,  # type: ignore[attr-defined]
                       _AdaCast._backward_cls)  # type: ignore[attr-defined]


def is_scaling_node(node: Any) -> bool:
    """Whether the backward ``node`` scales the gradient it sends upstream: our layer Functions and output
    points, or another autograd Function that computes an attached layer's backward itself.

    That other Function (the FP4 emulation's split backward, :mod:`lossscale_bench.precision.fp4_layers`) follows a
    protocol, so that this package never imports it: it names its module as ``ctx.layer_module``, takes the
    layer input as its first input (the edge that carries the layer's new scale), and computes the input
    gradient with the weight ``ctx.input_grad_weight(ctx, g, w)`` returns once :meth:`_Iteration.install`
    has set that attribute (:func:`_input_grad_weight`: ``s * w``)."""
    kind = type(node)
    if kind in _SCALING_NODE_TYPES:
        return True
    if kind in _PLAIN_NODE_TYPES:
        return False
    if not issubclass(kind, torch.autograd.function.BackwardCFunction):
        # a C++ node (ConvolutionBackward0, AccumulateGrad, ...) holds no attributes of its own: the graph walk
        # asks about ~140 nodes a step, and the type answers for all of them (issue 28)
        _PLAIN_NODE_TYPES.add(kind)
        return False
    module = getattr(node, "layer_module", None)
    return module is not None and _ATTACHED.get(module) is not None


#: node types that are not a Python Function's backward, so never a scaling node (:func:`is_scaling_node`)
_PLAIN_NODE_TYPES: set[type] = set()


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

    # ``scaler``: the PerLayerLossScaler that owns this backward (not imported here: it imports us)
    def __init__(self, scaler: Any, n_ids: int, root_scale: torch.Tensor, recompute: bool) -> None:
        self.scaler = scaler
        self.vals: list[torch.Tensor | None] = [None] * n_ids
        self.vals[ROOT_SCALE_ID] = root_scale
        self.recompute = recompute
        self.merges: list[_Merge] = []
        self.layer_ids: list[tuple[Any, int, int]] = []
        #: hooks on this iteration's graph nodes (removed by the next scale() once a backward ran, or update())
        self.handles: list[Any] = []
        self.backward_done = False
        #: merges may see branches from several device threads (model parallel)
        self.lock = threading.Lock()

    def install(self, root: Any, plan: GraphPlan, carried: dict[int, tuple[_Iteration, int] | None],
                unscaled: bool) -> None:
        """Hook this backward into ``plan``'s graph; ``root`` is the scaled loss's ``grad_fn``.

        ``carried`` is the scaler's: per parameter, the (iteration, scale id) whose value its
        ``.grad`` carries, set by the first backward of a step (``_UNSCALED`` when ``unscaled``);
        later backward passes of the step convert their gradients to it.
        """
        self.handles.append(root.register_prehook(self.on_backward_start))
        for node, in_id, out_id in plan.layers:
            node._ada = (self, in_id, out_id)
            if not isinstance(node, _SCALING_NODE_TYPES):  # another Function's layer (is_scaling_node)
                node.info = _ATTACHED[node.layer_module]
                node.input_grad_weight = _input_grad_weight
        #: (layer info, id of the scale arriving, id of the scale it sends upstream): per-layer scalers
        #: built on this machinery (the layer-wise dynamic one) read which parameters carry which layer's scale
        self.layer_ids = [(getattr(node, "info", None), in_id, out_id) for node, in_id, out_id in plan.layers]
        consumers: dict[int, tuple[Any, list[tuple[int, int, int]]]] = {}
        for spec in plan.merges:
            mi = len(self.merges)
            self.merges.append(_Merge(spec.out_id, [sid for _, _, sid in spec.edges]))
            for slot, (cnode, j, _) in enumerate(spec.edges):
                consumers.setdefault(id(cnode), (cnode, []))[1].append((j, mi, slot))
        for cnode, entries in consumers.values():
            entries.sort()
            self.handles.append(cnode.register_hook(_merge_hook(self, entries)))
        for acc, var, sid in plan.leaves:
            key = id(var)
            if key not in carried:
                carried[key] = _UNSCALED if unscaled else (self, sid)
            target = carried[key]
            if target is not None and target[0] is self and target[1] == sid:
                continue
            self.handles.append(acc.register_prehook(_convert_hook(self, sid, target)))

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
        s = self.scaler.layer_factor(self, info, g, w, prev)
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
        scale_ts = [self.vals[sid] for sid in m.ids]
        live = [(m.stash[k], self.vals[m.ids[k]]) for k in m.order if m.stash[k] is not None]
        if not live:
            self.vals[m.out_id] = torch.stack(scale_ts).amax()
            return None
        # every branch scale is a candidate, also those of branches whose gradient is None (zero)
        u_max = self.scaler.grad_format.u_max
        t = None
        if all(s.device.type == "cpu" and s.dtype == _F32 for s in scale_ts):
            # on the host: the same decision, without ~20 ops on 0-d tensors (branch_target_scale_host)
            max_abs = [0.0 if g is None else max_abs_value(g) for g in m.stash]
            scales = [s.item() for s in scale_ts]
            best = branch_target_scale_host(max_abs, scales, u_max)
            if best is not None:
                t = scale_ts[best]
            else:  # no branch fits (or a NaN): the fallback's value, also on the host where it can be
                value = branch_fallback_scale_host(max_abs, scales, u_max)
                if value is not None:
                    t = torch.tensor(value, dtype=_F32)
        if t is None:
            scales = torch.stack(scale_ts)
            zero = torch.zeros((), dtype=_F32, device=scales.device)
            max_abs = torch.stack([zero if g is None else _max_abs(g) for g in m.stash])
            t = branch_target_scale(max_abs, scales, u_max)
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
