"""The autograd Functions every per-layer loss scaler runs its layers through, and the patched forwards.

:class:`~.scaler.PerLayerLossScaler` (adaptive's design is in :mod:`lossscale_bench.scaling.adaptive`'s
docstring) gives every stock ``nn.Conv2d``/``nn.Linear`` an instance ``forward`` (:class:`PatchedForward`)
that runs :class:`_AdaConv2d`/:class:`_AdaLinear`. Their backward asks the backward pass's
:class:`~.iteration.Iteration` for the layer scale and folds it into the weight operand of the
input-gradient product (:func:`input_grad_weight`). Output scaling points (:class:`PointInfo`) put
:class:`_AdaCast` on a module's output instead (:func:`point_hook`).

``ATTACHED`` is the one registry of wrapped modules: :mod:`.scaler` and :mod:`.iteration` import
this object; it must not be re-created anywhere else.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..adaptive_rule import backward_fan_in

__all__ = [
    "ATTACHED",
    "LayerInfo",
    "PatchedForward",
    "PointInfo",
    "SCALING_NODE_TYPES",
    "input_grad_weight",
    "is_ours",
    "is_scaling_node",
    "point_hook",
]


class LayerInfo:
    """Per wrapped module: geometry and the scales it recorded (device tensors)."""

    #: a layer (statistics of g and W), not an output scaling point (:class:`PointInfo`)
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
        #: (id of the scale arriving, id of the scale sent upstream) in the backward now at this layer, set
        #: before the scaler's ``layer_factor`` is called (``Iteration.side`` is indexed by them)
        self.scale_ids: tuple[int, int] | None = None
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
        """Keep the scale this backward applied (None: none, no input gradient) and the one that arrived."""
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


def input_grad_weight(ctx, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
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
                x,
                weight,
                bias,
            )
            ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        else:  # no cast, and the gradients come out in the inputs' dtypes (~10 us a layer less)
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
        w_in = input_grad_weight(ctx, g, w)
        if not (need_x or need_w or need_b):
            return None, None, None, None
        gx, gw, gb = torch.ops.aten.convolution_backward(
            g,
            x,
            w_in,
            ctx.bias_sizes if need_b else None,
            info.stride,
            info.padding,
            info.dilation,
            False,
            [0, 0],
            info.groups,
            [bool(need_x), bool(need_w), need_b],
        )
        d = ctx.dtypes
        if d is None:
            return gx if need_x else None, gw if need_w else None, gb if need_b else None, None
        return (
            _cast(gx, d[0]) if need_x else None,
            _cast(gw, d[1]) if need_w else None,
            _cast(gb, d[2]) if need_b else None,
            None,
        )


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
        w_in = input_grad_weight(ctx, g, w)
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


class PointInfo:
    """An output scaling point (``output_scaling``): the gradient arriving at a module's output is
    scaled from its own statistics (``ada_loss_cast`` of the authors' later SSD; no weight).

    Same recording attributes as :class:`LayerInfo`, so the scaler's tables treat both alike.
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
        self.scale_ids: tuple[int, int] | None = None

    record = LayerInfo.record


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


def point_hook(info: PointInfo):
    """Forward hook putting :class:`_AdaCast` on a module's output (training graphs only)."""

    def hook(module, inputs, output):
        if (
            torch.is_grad_enabled()
            and isinstance(output, torch.Tensor)
            and output.requires_grad
            and output.is_floating_point()
        ):
            return _AdaCast.apply(output, info)
        return output

    return hook


#: the backward node types of this module's Functions: they scale what they send upstream
SCALING_NODE_TYPES = (
    _AdaConv2d._backward_cls,
    _AdaLinear._backward_cls,  # type: ignore[attr-defined]
    _AdaCast._backward_cls,
)  # type: ignore[attr-defined]


def is_scaling_node(node: Any) -> bool:
    """Whether the backward ``node`` scales the gradient it sends upstream: our layer Functions and output
    points, or another autograd Function that computes an attached layer's backward itself.

    That other Function (the FP4 emulation's split backward, :mod:`lossscale_bench.precision.fp4_layers`) follows a
    protocol, so that this package never imports it: it names its module as ``ctx.layer_module``, takes the
    layer input as its first input (the edge that carries the layer's new scale), and computes the input
    gradient with the weight ``ctx.input_grad_weight(ctx, g, w)`` returns once :meth:`Iteration.install`
    has set that attribute (:func:`input_grad_weight`: ``s * w``)."""
    kind = type(node)
    if kind in SCALING_NODE_TYPES:
        return True
    if kind in _PLAIN_NODE_TYPES:
        return False
    if not issubclass(kind, torch.autograd.function.BackwardCFunction):
        # a C++ node (ConvolutionBackward0, AccumulateGrad, ...) holds no attributes of its own: the graph walk
        # asks about ~140 nodes a step, and the type answers for all of them
        _PLAIN_NODE_TYPES.add(kind)
        return False
    module = getattr(node, "layer_module", None)
    return module is not None and ATTACHED.get(module) is not None


#: node types that are not a Python Function's backward, so never a scaling node (:func:`is_scaling_node`)
_PLAIN_NODE_TYPES: set[type] = set()


#: module -> LayerInfo of the scaler attached to it (a copied module is not in here: it runs unpatched)
ATTACHED: weakref.WeakKeyDictionary[nn.Module, LayerInfo] = weakref.WeakKeyDictionary()


class PatchedForward:
    """The instance ``forward`` of a wrapped Conv2d/Linear.

    A callable object rather than a bound method so that a model can be deep-copied
    or pickled while attached: the copy carries a ``PatchedForward`` of its own
    module, which is not in ``ATTACHED`` and therefore runs the class forward.
    """

    __slots__ = ("module",)

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, input: torch.Tensor) -> torch.Tensor:
        return _ada_forward(self.module, input)

    def __reduce__(self):
        return (PatchedForward, (self.module,))


def is_ours(forward: Any) -> bool:
    """Whether ``forward`` (a module's instance attribute) is a per-layer scaler's patched forward."""
    return isinstance(forward, PatchedForward)


def _ada_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    info = ATTACHED.get(self)
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
