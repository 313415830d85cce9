"""The fp8 round trip and the telemetry's census as small C functions, built once with the system's C compiler and called
through ctypes: the CPU emulation's cheapest path for the calls a training step makes.

Why, measured (issue 28, docs/benchmarks.md "What is left of an element row's cost"): a step of the
default study's E4M3 rows makes ~33 rounding calls, and the Inductor kernel they used cost ~195 us
a call before it touched an element: ~95 us in Dynamo's frame evaluation, AOTAutograd's runtime
wrapper and Inductor's Python ``call``, the rest in this package's flattening and dispatch. Its
loop also ran ~1.8 ns per element, 40 % of it in the bit casts, which Inductor emits as a store, a
scalar loop and a load. A C loop over the same arithmetic has none of that: ``memcpy`` bit casts
vectorise, and a ctypes call costs a few microseconds (and releases the GIL, as autograd's worker
thread wants).

Why it is safe to prefer it: the function is the same arithmetic as ``fp8._bits_fused`` (the
"exact fp32 split" in fp8's module doc), with integer compares for the NaN test and no
floating-point contraction or fast-math (``-ffp-contract=off``: a compiler may otherwise fuse the
multiply that builds the magic number into the addition; it would be exact here, but nothing is
left to chance). ``fp8`` runs each (format, saturate) variant on the probe values and uses it only
when it matches the eager kernel bit for bit, exactly as ``LazyCompiled`` does for Inductor's.

Why a cache keyed by the CPU: ``-march=native`` code can use instructions another machine lacks,
and a home directory may be shared by a cluster's nodes. The library's name hashes the source,
the flags, the compiler's version and the CPU's feature flags, and is written to a temporary file
and renamed into place, so trials starting together on one machine never load half a file.

When it is not used (callers fall back to the Inductor kernel, then to eager, same values):
``LSBENCH_NO_COMPILE=1`` (every compiled kernel off), ``LSBENCH_NO_NATIVE=1`` (this one only; a
benchmark compares the two that way), no C compiler, a compiler or loader error (a warning, once),
a tensor that is not on the CPU, not fp32 or not dense in memory, and a large tensor when torch
uses several threads (Inductor's kernel is parallel; this loop is not).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

from ._compile import compile_disabled

#: set to 1 to use the Inductor kernel instead of the C one (same values)
NO_NATIVE_ENV = "LSBENCH_NO_NATIVE"
#: where the built library is kept (default: $XDG_CACHE_HOME or ~/.cache, then lossscale_bench/native)
CACHE_ENV = "LSBENCH_NATIVE_CACHE"

_SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* y[i] = x[i] rounded to a float with mbits significand bits and exponents [emin, emax], to nearest
   even; past maxv: over_bits (the max, inf or NaN); NaN: nan_bits; the input's sign copied last. */
void lsb_round_fp8(const float *restrict x, float *restrict y, int64_t n, int32_t mbits, int32_t emin,
                   int32_t emax, float maxv, uint32_t over_bits, uint32_t nan_bits) {
    const uint32_t lo = (uint32_t)(emin + 127) << 23, hi = (uint32_t)(emax + 127) << 23;
    const float k = (float)(1u << (23 - mbits));
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = f2u(x[i]);
        uint32_t a = u & 0x7fffffffu;
        uint32_t e = a & 0x7f800000u;
        e = e < lo ? lo : e;
        e = e > hi ? hi : e;
        float m = u2f(e) * k;
        float r = (u2f(a) + m) - m;
        uint32_t b = r > maxv ? over_bits : f2u(r);
        b = a > 0x7f800000u ? nan_bits : b;
        y[i] = u2f(b | (u & 0x80000000u));
    }
}

/* out = [non-zero, non-zero below min_normal, non-zero at or below flush, non-zero not at or below maxv]:
   census.py's expression, with C's comparisons (false for NaN, except !=), so NaN counts as past maxv. */
void lsb_census(const float *restrict x, int64_t n, float min_normal, float flush, float maxv, int64_t *out) {
    int64_t nz = 0, sub = 0, fl = 0, sat = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = u2f(f2u(x[i]) & 0x7fffffffu);
        int64_t z = a != 0.0f;
        nz += z;
        sub += z & (a < min_normal);
        fl += z & (a <= flush);
        sat += z & !(a <= maxv);
    }
    out[0] = nz; out[1] = sub; out[2] = fl; out[3] = sat;
}
"""
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-std=c99", "-fPIC", "-shared")

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failed: str | None = None


def disabled() -> bool:
    """Whether the environment turns the C kernel off (read on every call, like ``compile_disabled``)."""
    return compile_disabled() or os.environ.get(NO_NATIVE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def failure() -> str | None:
    """Why the library could not be built or loaded (None while it works or was never tried)."""
    return _failed


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc):
        return shutil.which(cc)
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), else the processor's name: part of the cache key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lossscale_bench" / "native"


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\0".join([_SOURCE, " ".join(_FLAGS), version, _cpu_flags(), platform.machine()])
                         .encode()).hexdigest()[:20]
    name = f"lsb_round_{key}.so"
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / "lossscale_bench_native"):
        if (folder / name).is_file():
            return folder / name
        try:  # a home that cannot be written (a locked-down CI runner): the system's temporary folder
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                break
        except OSError:
            continue
    out = folder / name
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "lsb_round.c"
        src.write_text(_SOURCE)
        lib = Path(tmp) / "lsb_round.so"
        done = subprocess.run([cc, *_FLAGS, str(src), "-o", str(lib)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise RuntimeError(f"{Path(cc).name} failed (exit {done.returncode}){': ' + said[0] if said else ''}")
        os.replace(lib, out)  # atomic: a trial loading it meanwhile sees the whole file or none
    return out


def library() -> ctypes.CDLL | None:
    """The loaded library, built on first use; None when it cannot be had (``failure()`` says why,
    and a warning said it once)."""
    global _lib, _failed
    if _lib is not None or _failed is not None:
        return _lib
    with _lock:
        if _lib is None and _failed is None:
            try:
                cc = _compiler()
                if cc is None:
                    raise RuntimeError("no C compiler (cc, gcc or clang, or $CC) on the PATH")
                lib = ctypes.CDLL(str(_build(cc)))
                f = lib.lsb_round_fp8
                f.restype = None
                f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32,
                              ctypes.c_int32, ctypes.c_float, ctypes.c_uint32, ctypes.c_uint32]
                c = lib.lsb_census
                c.restype = None
                c.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_float, ctypes.c_float,
                              ctypes.c_void_p]
                _lib = lib
            except Exception as exc:  # noqa: BLE001 - any failure means: use the Inductor kernel
                _failed = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"lossscale_bench.numerics: the C rounding kernel is not available ({_failed}); "
                              "using the compiled torch kernel (same results)", RuntimeWarning, stacklevel=3)
    return _lib
