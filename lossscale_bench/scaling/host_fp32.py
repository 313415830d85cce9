"""fp32 arithmetic on Python floats, for the scalers' rules on the CPU: one torch operation on 0-d fp32 tensors,
done as one float operation rounded once to fp32.

Why: a per-layer rule is a dozen or more operations on 0-d tensors per layer and step, each
~3-8 us of dispatch on the CPU for one float operation (~0.1 us on the host). The values must stay the tensor
versions' bit for bit (a trial's numbers must not depend on which path ran), which is why each function
names the torch operation it stands for, and why the callers' tests compare the two on random and edge
values. The exactness argument: an fp32 sum, product, quotient or square root computed in fp64 and rounded
once to fp32 is the fp32 result (53 >= 2 * 24 + 2 bits: the double rounding is innocuous), overflow included
(:func:`f32` gives inf as the fp32 operation does).
"""

from __future__ import annotations

import ctypes
import math

import torch

__all__ = ["f32", "recip", "fmin", "floor_log2", "floor_pow2_log2"]


def f32(x: float) -> float:
    """``x`` rounded to fp32 (round to nearest even; overflow to inf, as an fp32 operation would)."""
    return ctypes.c_float(x).value


def recip(x: float) -> float:
    """``Tensor.reciprocal`` of an fp32 value (``+-0 -> +-inf``): also what ``float / tensor`` computes
    first (``torch/_tensor.py``: ``__rtruediv__`` is ``self.reciprocal() * other``)."""
    return math.copysign(math.inf, x) if x == 0.0 else f32(1.0 / x)


def fmin(a: float, b: float) -> float:
    """``torch.minimum`` of two values: NaN if either is NaN."""
    return a if a != a else (b if b != b or b < a else a)


#: a value whose significand lies this close below 2 (or is exactly 1) is decided by torch itself
_NEAR_POWER = 2.0 - 2.0**-12


def floor_log2(x: float) -> float:
    """``torch.floor(torch.log2(t))`` of a 0-d fp32 tensor ``t`` holding ``x`` (finite, > 0), as a float:
    ``frexp``'s exponent, except near a power of two, where torch decides (:func:`floor_pow2_log2`'s reasons)."""
    m, e = math.frexp(x)
    if m == 0.5 or 2.0 * m > _NEAR_POWER:
        return float(torch.floor(torch.log2(torch.tensor(x, dtype=torch.float32))))
    return float(e - 1)


def floor_pow2_log2(x: float) -> float:
    """``torch.exp2(torch.floor(torch.log2(t)))`` of a 0-d fp32 tensor ``t`` holding ``x`` (finite, > 0).

    Mathematically ``2**floor(log2 x)``, which ``frexp`` gives exactly. torch's fp32 ``log2`` can round a
    value just below a power of two up to it (then the floor is one higher) and need not be correctly
    rounded, so the two can differ only where ``x`` is within a few ulps of a power of two in log terms:
    there (a significand within 2**-12 below 2, or exactly 1), torch computes the floor (:func:`floor_log2`);
    ``exp2`` of that integer is a power of two, exact in fp32 down to its subnormals."""
    return f32(math.ldexp(1.0, int(floor_log2(x))))
