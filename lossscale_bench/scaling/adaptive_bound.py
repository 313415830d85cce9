"""Steps 7-9 of the adaptive rule (the bounds) in two parts, so that a backward pass spends a few operations a layer.

:func:`~.adaptive_rule.bound_scale_tensor` computes a layer's scale as ``R(F(min(u, A / P, U)))``: ``u`` the
layer's unbounded scale (its statistics), ``P`` the scale the arriving gradient carries, ``A`` the
accumulated bound (``accum_upper_bound``), ``U`` the layer bound (``scale_upper_bound``), ``F`` the power of
two at or below (``frexp``), ``R`` the fp16 storage. On an accelerator that is ~19 dispatched operations on
0-d tensors for every layer of every backward pass, although ``u`` changes only when statistics are recomputed.

``F`` and ``R`` are monotone (never decreasing), so they commute with ``min``:

    ``R(F(min(u, A / P, U))) == min(R(F(min(u, U))), R(F(A / P)))``

bit for bit, NaN included (both sides propagate it). The first part, :func:`layer_cap`, depends on the layer
alone: it is computed once per new ``u``. The second, ``R`` of :func:`headroom`, depends on the arriving scale.
With powers of two (``power_of_two``, the default: every layer scale ``s`` is then a power of two, 0 or inf),
the headroom of the scale a layer sends upstream, ``P * s``, is the arriving headroom divided by ``s``,
:func:`pass_headroom`: dividing by a power of two is exact, and ``F`` of an exact power-of-two multiple is the
same multiple of ``F``. That holds bit for bit while ``A / P`` is finite (``P`` above ``A * 2^-128``); below,
the carried headroom is inf where the direct one is a large finite power of two, which fp16 stores as inf too,
so the scales agree unless a layer scale is itself inf (a ``scale_upper_bound`` of 65520 or more). So a layer whose statistics are reused needs four operations (``R``'s two casts, one
``minimum``, one division), and the headroom is computed in full only where a scale starts (the loss) or two
branches merge. ``tests/scaling/test_adaptive_bound.py`` checks both identities on the values the rule meets and
at the edges (0, inf, NaN, subnormals, fp16's overflow), and the weights of whole trials, before and after.
"""

from __future__ import annotations

import torch

from .adaptive_rule import floor_pow2

__all__ = ["layer_cap", "headroom", "pass_headroom", "bound_from_parts"]

_F32 = torch.float32


def layer_cap(unbounded: torch.Tensor, *, scale_upper_bound: float, power_of_two: bool = True) -> torch.Tensor:
    """``R(F(min(u, U)))``: the layer's part of its bounded scale (0-d fp32, ``unbounded``'s device)."""
    s = unbounded.to(_F32).clamp(max=scale_upper_bound)
    if power_of_two:
        s = floor_pow2(s)
    return s.to(torch.float16).to(_F32)


def headroom(prev_scale: torch.Tensor, *, accum_upper_bound: float, power_of_two: bool = True) -> torch.Tensor:
    """``F(A / P)`` in fp32, ``A / P`` taken as :func:`~.adaptive_rule.bound_scale_tensor` takes it."""
    h = accum_upper_bound / prev_scale.to(_F32)
    return floor_pow2(h) if power_of_two else h


def bound_from_parts(cap: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """The bounded layer scale from :func:`layer_cap` and :func:`headroom`: ``min(cap, R(head))``."""
    return torch.minimum(cap, head.to(torch.float16).to(_F32))


def pass_headroom(head: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The headroom of ``P * scale`` from ``P``'s (module doc: exact when ``scale`` is a power of two, 0 or inf)."""
    return head / scale
