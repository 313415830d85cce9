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

:class:`_Fp4Layer` does this for ``Conv2d`` (zero padding, numeric ``padding``) and ``Linear``:
the module's own forward result is reused when the weight is not rounded (its graph is dropped),
recomputed from the rounded weight when it is, and its backward calls the two products itself.
Other layers (ConvTranspose2d, ``padding="same"``) keep the plain rounding (:func:`supported`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .formats import FloatFormat
from .numerics.fp8 import not_a_view
from .numerics.hadamard import hadamard_round


def supported(m: nn.Module) -> bool:
    """Whether :func:`fp4_layer` can split this layer's backward."""
    if isinstance(m, nn.Linear):
        return True
    return (type(m) is nn.Conv2d and m.padding_mode == "zeros" and not isinstance(m.padding, str))


def _forward(m: nn.Module, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    if isinstance(m, nn.Linear):
        return F.linear(x, w, b)
    return F.conv2d(x, w, b, m.stride, m.padding, m.dilation, m.groups)


def _grads(m: nn.Module, x, w, b, g_in, g_w, need_x: bool):
    """``(dx, dw, db)`` with ``g_in`` for the input gradient and the bias, ``g_w`` for the weight."""
    if isinstance(m, nn.Linear):
        gi2, gw2, x2 = g_in.reshape(-1, g_in.shape[-1]), g_w.reshape(-1, g_w.shape[-1]), x.reshape(-1, x.shape[-1])
        dx = (gi2 @ w).reshape(x.shape) if need_x else None
        return dx, gw2.T @ x2, (gi2.sum(0) if b is not None else None)

    def conv_bwd(g, mask):
        return torch.ops.aten.convolution_backward(g, x, w, [w.shape[0]] if b is not None else None, list(m.stride),
                                                   list(m.padding), list(m.dilation), False, [0, 0], m.groups, mask)
    if g_in is g_w:
        return conv_bwd(g_in, [need_x, True, b is not None])
    # the bias gradient as a sum, not from the dgrad call: oneDNN computes a bias gradient with its
    # weight-gradient kernel, so asking the dgrad call for it cost a second wgrad's time (~3 ms of ~6 on
    # ssd_tiny's largest layers; docs/benchmarks.md). The sum adds in another order than oneDNN's: the
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
    @staticmethod
    def forward(ctx, y, x, w, b, m, fwd, bwd, weight_fmt, hadamard):  # type: ignore[override]
        wq = w if weight_fmt is None else weight_fmt.round(w)
        if weight_fmt is not None:
            y = _forward(m, x, wq, b)
        ctx.save_for_backward(x, wq, b)
        ctx.m, ctx.bwd, ctx.hadamard = m, bwd, hadamard
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
        dx, dw, db = _grads(ctx.m, x, wq, b, g_in, g_w, ctx.needs_input_grad[1])
        return None, dx, dw, db, None, None, None, None, None


def fp4_layer(m: nn.Module, x: torch.Tensor, y: torch.Tensor, fwd: FloatFormat | None, bwd: FloatFormat | None,
              weight_fmt: FloatFormat | None, hadamard: bool) -> torch.Tensor:
    """The layer output ``y = m(x)`` replaced by one whose backward splits as the module doc says."""
    return _Fp4Layer.apply(y.detach(), x, m.weight, m.bias, m, fwd, bwd, weight_fmt, hadamard)
