"""The FP4 emulation's layer rounding where one rounded gradient is not enough.

The other emulations round the gradient arriving at a conv/linear output once, and torch's own
backward computes both products from it. Two parts of NVIDIA's NVFP4 recipe need more:

* the Hadamard transform of the weight-gradient inputs (``wgrad_hadamard``): the input gradient
  (dgrad) uses the gradient rounded as it is, the weight gradient (wgrad) uses ``H^T Q(H g)``
  along the tokens (:mod:`.numerics.hadamard`), so the two products see different gradients;
* weights in NVFP4 16x16 tiles (``nvfp4`` forward values): the forward product uses the rounded
  weight, and so does the input gradient (one quantised weight serves both, which is why the
  recipe tiles weights 16x16); the weight gradient reaches the fp32 weight unchanged (a
  straight-through estimate, as real FP4 training does).

:class:`_Fp4Layer` does this for ``Conv2d`` (zero padding, numeric ``padding``) and ``Linear``: the
module's own forward result is reused (its graph is dropped; with NVFP4 weights the module computed it
with :func:`round_weight`'s weight in the parameter's place), and its backward calls the two products
itself. Other layers (ConvTranspose2d, ``padding="same"``) keep the plain rounding (:func:`supported`).

A per-layer loss scaler (adaptive, layer-wise dynamic, amax) scales the input gradient of each layer
inside that layer's backward; here that backward is :class:`_Fp4Layer`'s, so the node follows the
scalers' protocol (:mod:`lossscale_bench.scaling.per_layer.functions`): it names its module
(``ctx.layer_module``), takes the layer input as its first input, and computes the input gradient with
the weight ``ctx.input_grad_weight(ctx, g, w)`` returns when a scaler has set that attribute. Without it
the scalers found no layer in a split model and silently scaled nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from ..numerics.hadamard import hadamard_round
from ..numerics.layout import not_a_view
from .formats import FloatFormat


def supported(m: nn.Module) -> bool:
    """Whether :func:`fp4_layer` can split this layer's backward."""
    if isinstance(m, nn.Linear):
        return True
    return type(m) is nn.Conv2d and m.padding_mode == "zeros" and not isinstance(m.padding, str)


def _grads(m: nn.Module, x, w, b, g_in, g_w, need_x: bool):
    """``(dx, dw, db)`` with ``g_in`` for the input gradient and the bias, ``g_w`` for the weight."""
    if isinstance(m, nn.Linear):
        gi2, gw2, x2 = g_in.reshape(-1, g_in.shape[-1]), g_w.reshape(-1, g_w.shape[-1]), x.reshape(-1, x.shape[-1])
        dx = (gi2 @ w).reshape(x.shape) if need_x else None
        return dx, gw2.T @ x2, (gi2.sum(0) if b is not None else None)

    def conv_bwd(g, mask):
        return torch.ops.aten.convolution_backward(
            g,
            x,
            w,
            [w.shape[0]] if b is not None else None,
            list(m.stride),
            list(m.padding),
            list(m.dilation),
            False,
            [0, 0],
            m.groups,
            mask,
        )

    if g_in is g_w:
        return conv_bwd(g_in, [need_x, True, b is not None])
    # the bias gradient as a sum, not from the dgrad call: oneDNN computes a bias gradient with its
    # weight-gradient kernel, so asking the dgrad call for it cost a second wgrad's time (~3 ms of ~6 on
    # ssd_tiny's largest layers; docs/records/index.md). The sum adds in another order than oneDNN's: the
    # bias gradient's last bits differ from before (a new run of a Hadamard row gives other digits).
    dx = conv_bwd(g_in, [need_x, False, False])[0] if need_x else None
    db = g_in.sum((0, 2, 3)) if b is not None else None
    return dx, conv_bwd(g_w, [False, True, False])[1], db


def _tokens_first(g: torch.Tensor, conv: bool) -> tuple[torch.Tensor, callable]:
    """``g`` as ``[tokens, channels]`` (the wgrad product's reduction runs over the tokens) and the inverse;
    a view of a channels_last conv gradient or a linear's, whose memory is already in that order."""
    if conv:
        n, c, h, w = g.shape
        return g.permute(0, 2, 3, 1).reshape(-1, c), lambda t: t.reshape(n, h, w, c).permute(0, 3, 1, 2)
    shape = g.shape
    return g.reshape(-1, shape[-1]), lambda t: t.reshape(shape)


class _Fp4Layer(torch.autograd.Function):
    """``x`` comes first so that the node's edge 0 is the layer input, as for the per-layer scalers' own
    layer Functions (module doc: "A per-layer loss scaler")."""

    @staticmethod
    def forward(ctx, x, y, w, b, wq, m, fwd, bwd, hadamard):  # type: ignore[override]
        ctx.save_for_backward(x, w if wq is None else wq, b)
        ctx.m, ctx.bwd, ctx.hadamard = m, bwd, hadamard
        #: the module whose backward this node computes (the per-layer scalers' protocol, module doc)
        ctx.layer_module = m
        return not_a_view(y if fwd is None else fwd.round(y), y)  # a view would break in-place ops after the layer

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        x, wq, b = ctx.saved_tensors
        bwd = ctx.bwd
        g_in = g if bwd is None else bwd.round(g)
        g_w = g_in
        if ctx.hadamard:
            rows, back = _tokens_first(g, isinstance(ctx.m, nn.Conv2d))
            g_w = back(hadamard_round(rows, (lambda t: t) if bwd is None else bwd.round))
        scale_hook = getattr(ctx, "input_grad_weight", None)
        w_dx = wq if scale_hook is None else scale_hook(ctx, g_in, wq)
        dx, dw, db = _grads(ctx.m, x, w_dx, b, g_in, g_w, ctx.needs_input_grad[0])
        return dx, None, dw, db, None, None, None, None, None


def round_weight(m: nn.Module, weight_fmt: FloatFormat) -> torch.Tensor:
    """``m.weight`` rounded to ``weight_fmt`` (no graph: the weight gradient reaches the fp32 weight
    unchanged, :class:`_Fp4Layer`), for the forward product: :func:`lossscale_bench.precision.layers.install_emulation`
    puts it in place of the weight for the duration of the module's forward, so the product is computed
    once, with it."""
    return weight_fmt.round(m.weight.detach())


def fp4_layer(
    m: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    fwd: FloatFormat | None,
    bwd: FloatFormat | None,
    wq: torch.Tensor | None,
    hadamard: bool,
) -> torch.Tensor:
    """The layer output ``y = m(x)`` replaced by one whose backward splits as the module doc says; ``wq``:
    the rounded weight ``y`` was computed with (:func:`round_weight`), or None for the weight itself."""
    return _Fp4Layer.apply(x, y.detach(), m.weight, m.bias, wq, m, fwd, bwd, hadamard)
