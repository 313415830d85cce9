"""Keep the host memory a training step frees inside the process, so the next step does not fault it back in.

Why: with glibc's default malloc, a CPU training step returns much of what it freed to the kernel (large
blocks are ``mmap``-ed and unmapped one by one; the heap top is trimmed once its free end passes a
threshold), and the next step's tensors fault every page back in, zeroed by the kernel. Measured on
ssd_tiny (batch 8, one thread; docs/records/index.md "Page faults"): 2,000-9,000 minor faults and 4-15 ms
of system time a step, a tenth to a quarter of the step, more for the emulated precisions (their
rounding allocates more temporaries). Two glibc settings end it: a fixed ``mmap`` threshold at glibc's
largest (32 MiB: blocks below it come from the heap, and fixing it also stops glibc's own threshold
adjustment) and a trim threshold (1 GiB) above what a step frees. Values do not change: torch's CPU
allocator aligns its blocks itself (64 bytes) wherever malloc finds them.

What it costs: freed memory up to the trim threshold stays in the process instead of going back to the
system, so a trial's resident size can sit up to that much above its live tensors. ``LSBENCH_MALLOC=system``
in the environment keeps glibc's defaults. Elsewhere (musl, macOS, Windows) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

#: mallopt parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc's largest mmap threshold on 64-bit (4 * 1024 * 1024 * sizeof(long)); mallopt refuses more
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30

_applied: bool | None = None

#: the environment variable that chooses, and its values: unset, empty or "kept" (the settings above, the
#: default) and "system" (glibc's own defaults)
MALLOC_ENV = "LSBENCH_MALLOC"
MALLOC_VALUES = ("", "kept", "system")


def setting_problem() -> str | None:
    """What is wrong with ``LSBENCH_MALLOC`` in the environment, in one line, or None: a misspelt ``system``
    must not silently keep the default (``lsbench run`` refuses it before any trial starts)."""
    value = os.environ.get(MALLOC_ENV, "")
    if value.strip().lower() in MALLOC_VALUES:
        return None
    return (
        f"{MALLOC_ENV}={value!r} in the environment: allowed: 'system' (glibc's malloc defaults) or 'kept' "
        f"(freed memory kept, the default; also when unset)"
    )


def keep_freed_memory() -> bool:
    """Apply the two settings once per process (module doc); whether they are in force. False where the C
    library is not glibc, where ``mallopt`` refused, or with ``LSBENCH_MALLOC=system``."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get(MALLOC_ENV, "").strip().lower() == "system":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mmap threshold first: set alone, the trim threshold makes it worse (every block over glibc's
    # 128 KiB default is then mmap-ed and unmapped each time: twice the faults, measured)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
