"""Where an element-wise rounding meets a tensor's memory layout and autograd.

:func:`memory_order_flat` flattens a tensor in memory order (free for a channels_last one) and gives
the inverse; :func:`is_channels_last` says which layout a 4-D tensor has; :func:`not_a_view` makes a
rounding's result a tensor that in-place operations after it may modify.
"""

from __future__ import annotations

import torch

__all__ = ["is_channels_last", "memory_order_flat", "not_a_view"]


def is_channels_last(x: torch.Tensor) -> bool:
    """A 4-D tensor laid out channels_last (and not also contiguous, as a 1x1 or single-channel one is)."""
    return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def memory_order_flat(x: torch.Tensor):
    """``(flat, unflatten)``: ``x``'s elements as a 1-D tensor in memory order, and the inverse.

    Why: an element-wise rounding does not care about order, but ``x.reshape(-1)`` of a
    channels_last tensor (the CPU backend's layout for every conv output and weight) is a copy
    into NCHW order, and reshaping the result back gave an NCHW tensor: every later op of the
    channels_last model then paid a layout conversion (measured: a third of an E4M3 step's time
    in ``copy_`` and a 5x slower max-pool). For a channels_last tensor the flat view is free and
    ``unflatten`` gives the result channels_last strides again; anything else is flattened as
    before (``reshape``, a view when ``x`` is contiguous).
    """
    if is_channels_last(x):
        n, c, h, w = x.shape
        return x.permute(0, 2, 3, 1).reshape(-1), lambda out: out.view(n, h, w, c).permute(0, 3, 1, 2)
    return x.reshape(-1), lambda out: out.reshape(x.shape)


def not_a_view(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``out`` as a tensor that owns its place in autograd, without copying its data.

    Why: the roundings return a view of their flat result (``reshape``/``permute`` back to the
    input's shape and layout), and autograd forbids modifying a custom Function's view output in
    place, which every in-place ReLU after a rounded conv does (SSD300/SSD512's VGG: "Output 0 of
    _RoundThrough is a view and is being modified inplace", found on an H200 and
    reproduced on the CPU). ``set_`` gives a fresh tensor over the same storage, shape and strides
    that is not recorded as a view; an input returned as it is gets a copy (a no-op rounding)."""
    if out is x:
        return x.clone()
    if out._base is None:
        return out
    return out.new_empty(0).set_(out.untyped_storage(), out.storage_offset(), out.size(), out.stride())
