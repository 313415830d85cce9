"""Exact, fast E4M3 and E5M2 round trips (fp32 -> fp8 -> fp32) for the CPU emulation.

Why not just ``t.to(torch.float8_e4m3fn).float()``: on CPU that eager cast costs ~10 ms per
2 M elements (E5M2 ~1.8 ms, fp16 ~0.4 ms), and the emulation rounds every activation gradient
and parameter gradient, so an E4M3-gradient step pays it many times over. The same rounding
written with fp32 arithmetic on the bits and fused by ``torch.compile`` costs ~0.5-1 ms, and
~3-5 ms eager (docs/records/index.md). Every implementation here is bit-identical to torch's
cast, NaN bit patterns included; the tests check it on ties, subnormals, the overflow edge and
1e6 random values.

The bit-level rounding ("exact fp32 split")
-------------------------------------------
For ``a = |x|``, let ``2^e`` be ``a``'s power of two (its exponent bits), clamped to the format's
normal range ``[2^emin, 2^emax]``, and ``M = 2^(e + 23 - mbits)``. Then ``(a + M) - M`` is ``a``
rounded to a multiple of ``2^(e - mbits)`` with round-to-nearest-even, because that is the ulp of
fp32 numbers in ``[M, 2M)`` and fp32 addition rounds to nearest even; the subtraction is exact.
For a normal target that multiple is exactly the format's ``mbits``-bit significand (a carry to
the next binade is exact too); below ``2^emin`` the clamp fixes the quantum at the format's
smallest subnormal ``2^(emin - mbits)``, which is exactly how subnormals round. fp32 subnormal
inputs need no special case. What remains is the format's edges:

* overflow: a rounded value above the format's max becomes ``+-max`` (saturating), ``+-inf``
  (E5M2, IEEE-like) or NaN (E4M3 has no inf);
* NaN keeps its sign and takes the fp32 bit pattern torch's cast gives (the fp8 NaN code
  widened: E4M3 ``0x7FF00000``, E5M2 ``0x7FE00000``, sign bit from the input);
* the sign is copied back last, so ``-0.0`` and negative values flushed to zero stay ``-0.0``.

Overflow of E4M3, saturating or not
-----------------------------------
Saturating E4M3 gives ``+-448`` for ``|x| > 448`` (inf included), as torch 2.14's CPU cast does; every
path here clamps before casting, because torch's own cast is not the same across versions (torch
2.11.0 gives NaN past 464 on the CPU and on CUDA: docs/records/index.md, "Rounding agreement"). The non-saturating
variant (OCP FP8's non-saturating mode, ml_dtypes' cast) turns values whose rounding leaves the
format into NaN. Where is that edge? 448 = 1.75 * 2^8 is the code ``S.1111.110`` (significand
bits 110); the next code up, ``S.1111.111`` = 1.875 * 2^8 = 480, is NaN in ``e4m3fn``. The
midpoint 464 is a tie between significand 110 (even) and 111 (odd), so round-half-to-even sends
464 *down* to 448; anything above 464 rounds to the 480 code, i.e. NaN. Hence: non-saturating
E4M3 gives NaN for ``|x| > 464`` and for +-inf, and 464 itself is 448. (It is easy to get the
parity backwards and send 464 to the 480 code; the tests pin 464 -> 448 and the next fp32 above
464 -> NaN.)

E5M2 has inf and torch's cast does not saturate it (57344 = 1.75 * 2^15; the tie at 61440 goes to
the even code 2^16, which is inf). ``saturate=True`` for E5M2 clamps to +-57344 instead, inf
included, as saturating hardware casts (``satfinite``) and the MX element casts do.

Implementations (``impl``)
--------------------------
* ``"auto"`` (default): on the CPU, ``"native"`` where it is available and passed its probe (a
  large tensor with several torch threads excepted: Inductor's loop is parallel); else
  ``"bits_compiled"``, falling back to the fastest eager one when compilation is disabled
  (``LSBENCH_NO_COMPILE=1``) or fails: ``"bits"`` for E4M3, ``"cast"`` for E5M2 (torch's E5M2
  cast is already vectorised).
* ``"native"``: the bit-level rounding as a C loop built with the system compiler and called through
  ctypes (:mod:`.native`: no Dynamo, no flattening of a dense tensor; CPU only; raises when it cannot
  be built or failed its probe).
* ``"bits"``: the bit-level rounding above in eager torch ops.
* ``"bits_compiled"``: the same, fused by Inductor.
* ``"cast"``: torch's eager cast (plus a clamp or a NaN rule where ``saturate`` asks for the
  behaviour torch's cast lacks).
* ``"cast_compiled"``: torch's cast under ``torch.compile`` (Inductor's NaN pattern is
  normalised to torch's eager one).

All functions are autograd-free (inputs are detached): they are meant for hooks and custom
autograd functions. bf16 and fp16 inputs are rounded through fp32 and returned in their own
dtype, which is exact (every E4M3/E5M2 value is representable in both); float64 goes through
torch's cast directly, so it is never rounded twice.

The formats themselves are in :mod:`.fp8_formats`; flattening in memory order, and a result that is
not an autograd view, in :mod:`.layout`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import torch

from .fp8_formats import E4M3, E5M2, SPECS, Fp8Spec
from .layout import is_channels_last, memory_order_flat
from .lazy_compile import LazyCompiled, same_values
from .native import ProbeChecked
from .native import disabled as native_disabled

__all__ = [
    "IMPLS",
    "NATIVE_SERIAL_MAX",
    "PROBE",
    "compiled_kernel",
    "fastest_eager",
    "native_fits",
    "native_kernel",
    "NativeKernel",
    "round_bits_eager",
    "round_bits_fused",
    "round_e4m3",
    "round_e5m2",
    "round_fp8",
    "rounding_magic",
]

_SIGN = -(2**31)  # int32 with only the sign bit set (0x80000000)
_EXP_MASK = 0x7F800000
_F32_INF_BITS = 0x7F800000


def _f64_nan_with_f32_payload(bits: int) -> float:
    """A Python float NaN whose conversion to fp32 has bit pattern ``bits`` (x86 and ARM keep the
    top payload bits when narrowing a NaN). ``nan_to_num(nan=...)`` takes a Python float, and this
    is how the eager kernel writes torch's exact NaN pattern without a masked copy."""
    mantissa = bits & 0x7FFFFF
    return struct.unpack("<d", struct.pack("<Q", (0x7FF << 52) | (mantissa << 29)))[0]


IMPLS = ("auto", "bits", "bits_compiled", "cast", "cast_compiled", "native")


def rounding_magic(ax: torch.Tensor, spec: Fp8Spec) -> torch.Tensor:
    """``M = 2^(clamp(e, emin, emax) + 23 - mbits)`` per element (module doc), as fp32."""
    e = (ax.view(torch.int32) & _EXP_MASK).clamp((spec.emin + 127) << 23, (spec.emax + 127) << 23)
    return e.view(torch.float32) * float(2 ** (23 - spec.mbits))


def round_bits_fused(x: torch.Tensor, spec: Fp8Spec, saturate: bool) -> torch.Tensor:
    """The bit-level rounding as one expression, written for Inductor to fuse into one loop.

    ``where`` on int32 bit patterns keeps the exact NaN payloads (a float NaN constant would be
    emitted as the C++ default quiet NaN, 0x7FC00000, which is not what torch's cast gives).
    """
    ax = x.abs()
    m = rounding_magic(ax, spec)
    r = (ax + m) - m
    if saturate:
        over = spec.max_bits
    else:
        over = _F32_INF_BITS if spec.has_inf else spec.nan_bits
    b = torch.where(r > spec.max, over, r.view(torch.int32))
    b = torch.where(x != x, spec.nan_bits, b)
    return (b | (x.view(torch.int32) & _SIGN)).view(torch.float32)


def round_bits_eager(x: torch.Tensor, spec: Fp8Spec, saturate: bool) -> torch.Tensor:
    """The bit-level rounding with in-place eager ops and no boolean masks.

    Why no masks: on this CPU a comparison producing a bool tensor costs ~1 ms per 2 M elements
    and ``where``/``masked_fill`` ~4 ms, more than the rounding itself; clamps, ``nan_to_num``
    and power-of-two multiplies are ~0.25 ms each. The overflow rules become arithmetic:

    * saturate: ``clamp(max)`` (it propagates NaN);
    * overflow to inf (E5M2): the first code above ``max`` is ``2^(emax+1)``, so multiplying by
      ``2^(127-emax)`` overflows to inf exactly for those codes; multiplying back is exact;
    * overflow to NaN (E4M3): shift by ``c = 2^(emax+1) - first code above max`` (exact for every
      representable value), apply the same overflow trick, shift back; the resulting ``+inf`` and
      any NaN then become the format's NaN through ``nan_to_num``.
    """
    nan = _f64_nan_with_f32_payload(spec.nan_bits)
    ax = x.abs()
    m = rounding_magic(ax, spec)
    r = ax.add_(m)
    r.sub_(m)
    if saturate:
        r.clamp_(max=spec.max)
        torch.nan_to_num(r, nan=nan, posinf=spec.max, out=r)
    else:
        up, down = float(2.0 ** (127 - spec.emax)), float(2.0 ** (spec.emax - 127))
        shift = 0.0 if spec.has_inf else 2.0 ** (spec.emax + 1) - (spec.max + 2.0 ** (spec.emax - spec.mbits))
        if shift:
            r.add_(shift)
        r.mul_(up).mul_(down)
        if shift:
            r.sub_(shift)
        posinf = float("inf") if spec.has_inf else nan
        torch.nan_to_num(r, nan=nan, posinf=posinf, out=r)
    return torch.copysign(r, x, out=r)


def _torch_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torch's cast to ``dtype`` (one place, so a test can stand in another torch's behaviour)."""
    return x.to(dtype)


def _cast_eager(x: torch.Tensor, spec: Fp8Spec, saturate: bool) -> torch.Tensor:
    """torch's own cast, with the overflow behaviour ``saturate`` asks for (module doc).

    Saturation is a clamp before the cast for E4M3 too: torch's ``float8_e4m3fn`` cast of values
    past 464 is not the same across versions (measured: +-448 in torch 2.14.1 on the CPU, NaN in
    torch 2.11.0 on both the CPU and an H200; docs/records/index.md, "Rounding agreement"), and the
    emulation must not depend on it."""
    if saturate:
        x = x.clamp(-spec.max, spec.max)
    y = _torch_cast(x, spec.dtype).to(x.dtype)
    if not spec.has_inf and not saturate:
        nan = torch.full_like(y, _f64_nan_with_f32_payload(spec.nan_bits))
        y = torch.copysign(torch.where(x.abs() > spec.overflow_midpoint, nan, y), x)
    return y


def _cast_fused(x: torch.Tensor, spec: Fp8Spec, saturate: bool) -> torch.Tensor:
    """torch's cast for Inductor, NaNs rewritten to torch's eager bit pattern (the sign comes
    from the input: Inductor's clamp may return a NaN of either sign)."""
    y = _torch_cast(x.clamp(-spec.max, spec.max) if saturate else x, spec.dtype).float()
    if not spec.has_inf and not saturate:
        y = torch.where(x.abs() > spec.overflow_midpoint, float("nan"), y)
    b = torch.where(y != y, spec.nan_bits, y.view(torch.int32) & ~_SIGN)
    return (b | (x.view(torch.int32) & _SIGN)).view(torch.float32)


def _probe_values() -> torch.Tensor:
    """Values a compiled kernel must round exactly like the eager one before it is used
    (``LazyCompiled``'s probe): zeros, fp32 subnormals, both formats' subnormal ties, ties in the
    normal range, the overflow edges of E4M3, E5M2 and fp16, huge values, inf and NaN."""
    v = [
        0.0,
        1e-45,
        3 * 2.0**-149,
        2.0**-127,
        2.0**-126,
        2.0**-20,
        2.0**-17,
        3 * 2.0**-17,
        2.0**-16,
        2.0**-10,
        1.5 * 2.0**-9,
        2.5 * 2.0**-9,
        2.0**-6 - 2.0**-20,
        0.3,
        1.0,
        1.0625,
        17.0,
        19.0,
        240.0,
        448.0,
        463.99997,
        464.0,
        464.00003,
        480.0,
        500.0,
        57344.0,
        61439.996,
        61440.0,
        65504.0,
        65520.0,
        1e6,
        1e38,
        3.4028234663852886e38,
        float("inf"),
        float("nan"),
    ]
    t = torch.tensor(v, dtype=torch.float32)
    return torch.cat([t, -t])


PROBE = _probe_values()


def fastest_eager(spec: Fp8Spec) -> Callable:
    """The eager fallback of the compiled kernels: the bit-level rounding for E4M3 (~3 ms per
    2 M elements against ~10 ms for torch's cast), torch's cast for E5M2 (vectorised, ~1.8 ms)."""
    return _cast_eager if spec.has_inf else round_bits_eager


def _kernel(fn: Callable, spec: Fp8Spec, saturate: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def kernel(x: torch.Tensor) -> torch.Tensor:
        return fn(x, spec, saturate)

    return kernel


_COMPILED: dict[tuple[str, str, bool], LazyCompiled] = {}


def compiled_kernel(kind: str, spec: Fp8Spec, saturate: bool) -> LazyCompiled:
    """The lazily compiled ``kind`` ("bits" or "cast") kernel for ``spec``/``saturate``, cached
    per process (one Inductor graph serves every shape; see ``_compile``)."""
    key = (kind, spec.name, saturate)
    k = _COMPILED.get(key)
    if k is None:
        fused = round_bits_fused if kind == "bits" else _cast_fused
        eager = fastest_eager(spec) if kind == "bits" else _cast_eager
        tag = f"{kind}_{spec.name}_{'sat' if saturate else 'nosat'}"
        k = _COMPILED.setdefault(
            key, LazyCompiled(_kernel(fused, spec, saturate), tag, eager=_kernel(eager, spec, saturate), probe=(PROBE,))
        )
    return k


class NativeKernel(ProbeChecked):
    """The C rounding for one format and overflow rule, probe-checked before its first use.

    ``__call__`` takes a CPU fp32 tensor that is dense in memory (contiguous or channels_last) and
    returns a new one with the same shape and strides: the loop runs over memory order, which an
    element-wise rounding does not mind, so no flattening or copying back is needed."""

    function = "lsb_round_fp8"

    def __init__(self, spec: Fp8Spec, saturate: bool) -> None:
        super().__init__()
        self.spec, self.saturate = spec, saturate
        over = spec.max_bits if saturate else (_F32_INF_BITS if spec.has_inf else spec.nan_bits)
        self._args = (spec.mbits, spec.emin, spec.emax, spec.max, over, spec.nan_bits)

    def describe(self) -> str:
        return f"rounding kernel for {self.spec.name} ({'saturating' if self.saturate else 'non-saturating'})"

    def matches_probe(self) -> bool:
        """Bit for bit equal to the eager kernel on ``PROBE``."""
        return same_values(self(PROBE), _kernel(fastest_eager(self.spec), self.spec, self.saturate)(PROBE))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        self._fn(x.data_ptr(), y.data_ptr(), x.numel(), *self._args)
        return y


_NATIVE: dict[tuple[str, bool], NativeKernel] = {}
#: with several torch threads, tensors above this many elements go to Inductor's parallel kernel
NATIVE_SERIAL_MAX = 1 << 16


def native_kernel(spec: Fp8Spec, saturate: bool, required: bool = False) -> NativeKernel | None:
    """The probe-checked C kernel for ``spec``/``saturate``, or None where it is turned off
    (``LSBENCH_NO_COMPILE``, ``LSBENCH_NO_NATIVE``) or cannot be had; ``required``: raise instead."""
    k = _NATIVE.get((spec.name, saturate))
    if k is None:
        k = _NATIVE.setdefault((spec.name, saturate), NativeKernel(spec, saturate))
    if not required and native_disabled():
        return None
    if k.ready():
        return k
    if required:
        raise RuntimeError(f"impl='native' is not available: {k.broken}")
    return None


def native_fits(x: torch.Tensor) -> bool:
    """A tensor the C kernel takes (CPU, dense in memory) at a size where it is the faster one."""
    return x.device.type == "cpu" and (x.numel() <= NATIVE_SERIAL_MAX or torch.get_num_threads() == 1)


def _round_f32(x: torch.Tensor, spec: Fp8Spec, saturate: bool, impl: str) -> torch.Tensor:
    """Round a contiguous 1-D fp32 tensor with the chosen implementation."""
    if impl == "native":
        if x.device.type != "cpu":
            raise ValueError(f"impl='native' rounds CPU tensors, not {x.device.type} ones")
        return native_kernel(spec, saturate, required=True)(x)
    if impl == "auto" and native_fits(x):
        k = native_kernel(spec, saturate)
        if k is not None:
            return k(x)
    if impl == "bits":
        return round_bits_eager(x, spec, saturate)
    if impl == "cast":
        return _cast_eager(x, spec, saturate)
    kind = "cast" if impl == "cast_compiled" else "bits"
    k = compiled_kernel(kind, spec, saturate)
    if x.numel() < 2:  # sizes 0 and 1 would cost Dynamo a second graph (see _compile)
        return k.eager(x)
    return k(x)


def round_fp8(x: torch.Tensor, fmt: str | Fp8Spec, saturate: bool | None = None, impl: str = "auto") -> torch.Tensor:
    """Round ``x`` to E4M3 or E5M2 and back, bit-identical to torch's cast (module doc).

    ``saturate`` None means the format's torch behaviour: E4M3 saturates at +-448 (torch's CPU
    cast), E5M2 overflows to +-inf. The result has ``x``'s shape and dtype, no autograd history,
    and is a new tensor (``x`` is never modified).
    """
    spec = SPECS[fmt] if isinstance(fmt, str) else fmt
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; allowed: {', '.join(IMPLS)}")
    if saturate is None:
        saturate = not spec.has_inf
    x = x.detach()
    if x.dtype == torch.float64:
        return _cast_eager(x, spec, saturate)
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"round_fp8 takes floating-point tensors, not {x.dtype}")
    if impl == "auto" and x.dtype == torch.float32 and native_fits(x) and (x.is_contiguous() or is_channels_last(x)):
        k = native_kernel(spec, saturate)
        if k is not None:  # a dense tensor needs no flattening: the C loop runs over memory order
            return k(x)
    # detach *after* reshaping: a view's ``_base`` would make Dynamo guard on the base's shape
    # and recompile for every new base shape
    flat, unflatten = memory_order_flat(x)
    # contiguous: an expanded tensor (the gradient of a sum) flattens to stride 0, and a stride the
    # compiled graph has not seen makes Dynamo compile a second one
    out = _round_f32(flat.to(torch.float32).detach().contiguous(), spec, saturate, impl)
    return unflatten(out).to(x.dtype)


def round_e4m3(x: torch.Tensor, saturate: bool = True, impl: str = "auto") -> torch.Tensor:
    """Round to E4M3 (``float8_e4m3fn``) and back.

    ``saturate=True``: bit-identical to ``x.to(torch.float8_e4m3fn).to(x.dtype)`` on CPU
    (``|x| > 448`` and +-inf give +-448, NaN stays NaN). ``saturate=False``: the non-saturating
    variant: ``|x| > 464`` and +-inf give NaN (with ``x``'s sign), everything else as above.
    """
    return round_fp8(x, E4M3, saturate, impl)


def round_e5m2(x: torch.Tensor, saturate: bool = False, impl: str = "auto") -> torch.Tensor:
    """Round to E5M2 (``float8_e5m2``) and back.

    ``saturate=False``: bit-identical to ``x.to(torch.float8_e5m2).to(x.dtype)`` (``|x| >= 61440``
    gives +-inf). ``saturate=True``: such values, and +-inf, give +-57344 instead.
    """
    return round_fp8(x, E5M2, saturate, impl)
