"""The telemetry's element counts of a gradient against a format's thresholds, as one fused kernel.

Why a kernel of its own: on every logged step the telemetry counts, for each layer's activation
gradient and each parameter gradient, the non-zero elements and those below the format's
smallest normal, at or below its flush threshold and past its maximum. Written as eager torch
ops that is ~12 passes over the tensor (an ``abs``, four comparisons, three ``&``, four sums)
and ~60 calls a logged step on ssd_tiny: a logged step cost ~80 ms more than a plain one
(benchmarks/trial_cost.py). Inductor fuses the same expression into one loop with four
reductions. Same values as the eager expression (integer counts; the probe and the tests check
it, NaN and inf included), through :class:`~._compile.LazyCompiled`'s fallback when compiling is
off or fails.

On the CPU the same counts come first from a C loop (:mod:`.native`, ``lsb_census``), for the
reason the fp8 rounding does: a compiled call's dispatch (~100-200 us) is more than the loop's work
at most of a step's sizes, and below ``COMPILED_FROM`` elements the eager expression's dozen op
calls cost as much. It is checked on the probe values against the eager expression before its
first use, per threshold triple, and left for the compiled kernel if it differs.
"""

from __future__ import annotations

import warnings

import torch

from .fp8 import native_fits
from .layout import is_channels_last, memory_order_flat
from .lazy_compile import LazyCompiled, same_values
from .native import disabled as native_disabled
from .native import library as native_library


def _census(x: torch.Tensor, min_normal: float, flush: float, max_: float) -> torch.Tensor:
    """``[non-zero, subnormal, flushed, saturated]`` of ``x`` (NaN counts as past ``max_``)."""
    a = x.abs()
    nz = a != 0
    return torch.stack([nz.sum(), (nz & (a < min_normal)).sum(), (nz & (a <= flush)).sum(), (nz & ~(a <= max_)).sum()])


def _kernel(min_normal: float, flush: float, max_: float):
    def census(x: torch.Tensor) -> torch.Tensor:
        return _census(x, min_normal, flush, max_)

    return census


_PROBE = torch.tensor(
    [
        0.0,
        -0.0,
        1e-45,
        2.0**-149,
        2.0**-25,
        2.0**-24,
        2.0**-17,
        2.0**-16,
        2.0**-14,
        2.0**-10,
        2.0**-9,
        2.0**-6,
        0.5,
        448.0,
        448.00003,
        57344.0,
        65504.0,
        65520.0,
        1e30,
        float("inf"),
        float("nan"),
    ]
)
_KERNELS: dict[tuple[float, float, float], LazyCompiled] = {}
#: per threshold triple: whether the C census passed its probe (absent: not checked yet)
_NATIVE_OK: dict[tuple[float, float, float], bool] = {}


def _native_census(x: torch.Tensor, key: tuple[float, float, float]) -> torch.Tensor | None:
    """The counts from the C loop over ``x``'s memory (dense, fp32, CPU), or None where it is off,
    unavailable or failed its probe for these thresholds."""
    if native_disabled():
        return None
    lib = native_library()
    if lib is None:
        return None
    ok = _NATIVE_OK.get(key)
    if ok is None:
        probe = torch.cat([_PROBE, -_PROBE])
        got = torch.empty(4, dtype=torch.int64)
        lib.lsb_census(probe.data_ptr(), probe.numel(), *key, got.data_ptr())
        ok = _NATIVE_OK.setdefault(key, same_values(got, _census(probe, *key)))
        if not ok:
            warnings.warn(
                f"lossscale_bench.numerics: the C census for thresholds {key} differs from the "
                "eager expression on the probe values; using the compiled torch kernel (same counts)",
                RuntimeWarning,
                stacklevel=3,
            )
    if not ok:
        return None
    out = torch.empty(4, dtype=torch.int64)
    lib.lsb_census(x.data_ptr(), x.numel(), *key, out.data_ptr())
    return out


#: tensors with fewer elements are counted by the eager expression: below ~2**18 elements its dozen
#: op calls cost about what one compiled call's dispatch does, and a process that only ever sees small
#: tensors (the test suite's tiny models) then never pays the compilation (seconds per process)
COMPILED_FROM = 2**18


def census(x: torch.Tensor, min_normal: float, flush: float, max_: float) -> torch.Tensor:
    """Counts of ``x``'s elements (int64 tensor of 4, on ``x``'s device): non-zero; non-zero below
    ``min_normal``; non-zero at or below ``flush``; non-zero not at or below ``max_`` (inf, NaN).
    One compiled kernel per threshold triple, cached per process."""
    key = (float(min_normal), float(flush), float(max_))
    k = _KERNELS.get(key)
    if k is None:
        fn = _kernel(*key)
        tag = "census_" + "_".join(f"{v:.3e}".replace("+", "p").replace("-", "m") for v in key)
        k = _KERNELS.setdefault(key, LazyCompiled(fn, tag, probe=(torch.cat([_PROBE, -_PROBE]),)))
    xd = x.detach()
    if xd.dtype == torch.float32 and native_fits(xd) and (xd.is_contiguous() or is_channels_last(xd)):
        counts = _native_census(xd, key)
        if counts is not None:
            return counts
    # memory order (no layout copy of a channels_last gradient); contiguous: a stride-0 (expanded)
    # gradient would cost a second compiled graph (see fp8.round_fp8)
    flat = memory_order_flat(xd)[0].contiguous()
    if flat.numel() < COMPILED_FROM:
        return k.eager(flat)
    return k(flat)
