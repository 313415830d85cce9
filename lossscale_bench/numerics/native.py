"""The C loops of the CPU emulation: the fp8 round trip, the block-scaled round trips (MX32, E2M1, MXFP4, NVFP4),
the largest magnitude, the telemetry's census and the 16x16 Hadamard transform's sums, built once with the
system's C compiler from the sources in ``csrc/`` (package data) and called through ctypes: the CPU emulation's
cheapest path for the calls a training step makes.

The sources, one file per job: ``lsb_bits.h`` (bit casts, one element's rounding), ``round_fp8.c``
(``lsb_round_fp8``), ``block_elem.h`` + ``layout.h`` + ``block_round.c`` (``lsb_block_round``: one block's scale
and element, the channels_last tile transposes, the passes), ``reductions.c`` (``lsb_max_abs_bits``,
``lsb_census``), ``hadamard.c`` + the generated ``hadamard_chunk.h`` (``lsb_hadamard16``; its generator and the
test that it is up to date: tests/numerics/test_native_sources.py). They are compiled together into one library.

Why, measured (docs/records/index.md "What is left of an element row's cost"): a step of the default study's E4M3
rows makes ~33 rounding calls, and the Inductor kernel they used cost ~195 us a call before it touched an
element: ~95 us in Dynamo's frame evaluation, AOTAutograd's runtime wrapper and Inductor's Python ``call``, the
rest in this package's flattening and dispatch. Its loop also ran ~1.8 ns per element, 40 % of it in the bit
casts, which Inductor emits as a store, a scalar loop and a load. A C loop over the same arithmetic has none of
that: ``memcpy`` bit casts vectorise, and a ctypes call costs a few microseconds (and releases the GIL, as
autograd's worker thread wants).

The block round trips add what the torch kernels spent most on: a channels_last gradient was copied into the
blocks' logical order and back around each call. The C loop reads it as it lies where every block stays inside
one (image, channel) plane (H*W a multiple of the block: every large activation gradient of the SSD models): a
block is then one float in each of `block` rows of C floats, so all C channels' blocks are reduced, scaled and
rounded together along the unit stride (~1.5x cheaper than the transposes). Elsewhere (weight gradients' 3x3
planes, odd map sizes) it transposes each image into logical order in 16x16 tiles in a per-thread buffer (one
image at a time where no block straddles two), and pads a ragged last block inside. Measured in
docs/records/index.md.

Why it is safe to prefer it: the function is the same arithmetic as ``fp8._bits_fused`` (the "exact fp32 split"
in fp8's module doc), with integer compares for the NaN test and no floating-point contraction or fast-math
(``-ffp-contract=off``: a compiler may otherwise fuse the multiply that builds the magic number into the
addition; it would be exact here, but nothing is left to chance); the block loops are the same arithmetic as the
torch kernels of ``block_scaling`` and ``fp4``, op for op in fp32, checked the same way per configuration
(``block_scaling.NativeBlock``). ``-fno-trapping-math`` only lets the compiler compute both sides of a select
(floating-point exception flags, which nothing here reads, are the only thing it may change): without it gcc
keeps the stochastic rounding's ``floorf`` and conversions behind branches and does not vectorise that loop
(``-fopt-info-vec``: "control flow in loop"). Each user of a function (:class:`ProbeChecked`) runs it on probe
values and uses it only when it matches the eager kernel bit for bit, exactly as ``LazyCompiled`` does for
Inductor's.

Why a cache keyed by the CPU: ``-march=native`` code can use instructions another machine lacks, and a home
directory may be shared by a cluster's nodes. The library's name hashes every source file (name and text), the
flags, the compiler's version and the CPU's feature flags, and is written to a temporary file and renamed into
place, so trials starting together on one machine never load half a file.

Why every load checks the file first: a library cut short in the cache (a full disk, a copy interrupted, a
cache synced by hand) is mapped by the loader as it lies, and touching its missing pages kills the process with
SIGBUS ("Bus error", exit 135, no Python frame to report it, runs left RUNNING), in every later run, since the
name still matches. So the build writes a record beside the library, ``<name>.so.sha256`` (its size and sha256,
renamed into place after the library), and every load, a cache hit included, reads the library and compares
before the loader sees it. A library that does not match its record, or has none (an empty file, a corrupt or
foreign ELF, a cache an older version wrote), is rebuilt with one ``lsbench: note:`` line on stderr, then
loaded; a rebuild that fails falls back as below.

When it is not used (callers fall back to the Inductor kernel, then to eager, same values):
``LSBENCH_NO_COMPILE=1`` (every compiled kernel off), ``LSBENCH_NO_NATIVE=1`` (this one only; a benchmark
compares the two that way), no C compiler, a compiler or loader error or a build over ten minutes (a warning,
once), a tensor that is not on the CPU, not fp32 or not dense in memory, and a large tensor when torch uses
several threads (Inductor's kernel is parallel; this loop is not).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

from .lazy_compile import compile_disabled

__all__ = ["CACHE_ENV", "NO_NATIVE_ENV", "SOURCE_DIR", "ProbeChecked", "disabled", "failure", "library", "record_path"]

#: set to 1 to use the Inductor kernel instead of the C one (same values)
NO_NATIVE_ENV = "LSBENCH_NO_NATIVE"
#: where the built library is kept (default: $XDG_CACHE_HOME or ~/.cache, then lossscale_bench/native)
CACHE_ENV = "LSBENCH_NATIVE_CACHE"
#: the longest a build may take, in seconds: it costs ~50 s of one core, and took over 120 s on two cores that
#: eight test runs shared (2026-12-02)
_BUILD_TIMEOUT_S = 600
#: the folder of the C sources (package data): every ``*.c`` in it is compiled, every ``*.c`` and ``*.h`` keys the cache
SOURCE_DIR = Path(__file__).resolve().parent / "csrc"

_FLAGS = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fno-trapping-math",
    "-std=c99",
    "-fPIC",
    "-shared",
)

_c_void_p, _i32, _i64, _u32, _u64, _f32 = (
    ctypes.c_void_p,
    ctypes.c_int32,
    ctypes.c_int64,
    ctypes.c_uint32,
    ctypes.c_uint64,
    ctypes.c_float,
)
#: each exported function: (result type, argument types), as the C sources declare them
_SIGNATURES = {
    "lsb_round_fp8": (None, [_c_void_p, _c_void_p, _i64, _i32, _i32, _i32, _f32, _u32, _u32]),
    "lsb_block_round": (
        _i32,
        [
            _c_void_p,
            _c_void_p,
            _i64,
            _i32,
            _i64,
            _i64,
            _i64,
            _i64,
            _i32,
            _i32,
            _i32,
            _i32,
            _i32,
            _f32,
            _u32,
            _u32,
            _i32,
            _u64,
            _c_void_p,
        ],
    ),
    "lsb_max_abs_bits": (_u32, [_c_void_p, _i64]),
    "lsb_hadamard16": (None, [_c_void_p, _c_void_p, _i64, _i64, _i64, _c_void_p]),
    "lsb_census": (None, [_c_void_p, _i64, _f32, _f32, _f32, _c_void_p]),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failed: str | None = None


def disabled() -> bool:
    """Whether the environment turns the C kernel off (read on every call, like ``compile_disabled``)."""
    from ..core.env_vars import env_flag

    return compile_disabled() or env_flag(NO_NATIVE_ENV)


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


def _sources(folder: Path) -> list[Path]:
    """The C sources and headers in ``folder``, in name order."""
    return sorted(p for p in folder.iterdir() if p.suffix in (".c", ".h") and p.is_file())


def _key(cc: str, folder: Path = SOURCE_DIR) -> str:
    """The cache key: every source's name and text, the flags, the compiler's version, the CPU's features."""
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        version = ""
    texts = [f"{p.name}\0{p.read_text()}" for p in _sources(folder)]
    return hashlib.sha256(
        "\0".join([*texts, " ".join(_FLAGS), version, _cpu_flags(), platform.machine()]).encode()
    ).hexdigest()[:20]


def record_path(lib: Path) -> Path:
    """The record of ``lib``'s build beside it: ``"<size> <sha256>"``, written after the library."""
    return lib.with_name(lib.name + ".sha256")


def _digest(path: Path) -> str:
    """``"<size> <sha256>"`` of the file at ``path``."""
    data = path.read_bytes()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def _problem(lib: Path) -> str | None:
    """Why the cached ``lib`` may not be loaded; None when it is the file its build recorded."""
    try:
        recorded = record_path(lib).read_text().split()
        size = int(recorded[0])
    except (OSError, ValueError, IndexError):
        return "has no record of its build (written by an older version, or its build was cut short)"
    try:
        have = _digest(lib).split()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if int(have[0]) != size:
        return f"is {have[0]} bytes where its build wrote {size} (cut short or overwritten)"
    if have[1:] != recorded[1:2]:
        return "is not the file its build wrote (its sha256 differs)"
    return None


def _writable(cache: Path) -> bool:
    try:  # a home that cannot be written (a locked-down CI runner): the system's temporary folder
        cache.mkdir(parents=True, exist_ok=True)
        return os.access(cache, os.W_OK)
    except OSError:
        return False


def _build(cc: str, folder: Path = SOURCE_DIR) -> Path:
    """The library built from ``folder``'s sources: from the cache where it matches its build's record, else
    compiled into it (or, where the cache cannot be written, into the system's temporary folder)."""
    name, stale = f"lsb_round_{_key(cc, folder)}.so", None
    for cache in (_cache_dir(), Path(tempfile.gettempdir()) / "lossscale_bench_native"):
        found = cache / name
        if found.is_file():
            problem = _problem(found)
            if problem is None:
                return found
            stale = stale or (found, problem)
        if _writable(cache):
            break
    out = cache / name
    if stale is not None:
        where = "" if stale[0] == out else f" in {out.parent}"
        print(f"lsbench: note: {stale[0]}: the cached C library {stale[1]}; rebuilding it{where}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        lib, record = Path(tmp) / "lsb_round.so", Path(tmp) / "record"
        units = [str(p) for p in _sources(folder) if p.suffix == ".c"]
        try:
            done = subprocess.run(
                [cc, *_FLAGS, *units, "-o", str(lib)], capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{Path(cc).name} took over {_BUILD_TIMEOUT_S} s") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise RuntimeError(f"{Path(cc).name} failed (exit {done.returncode}){': ' + said[0] if said else ''}")
        record.write_text(_digest(lib) + "\n")
        os.replace(lib, out)  # atomic: a trial loading it meanwhile sees the whole file or none
        os.replace(record, record_path(out))  # after the library: a record names a library written whole
    return out


def _load() -> ctypes.CDLL:
    """Build (or find) and load the library, its functions' types set."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang, or $CC) on the PATH")
    lib = ctypes.CDLL(str(_build(cc)))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded library, built on first use; None when it cannot be had (``failure()`` says why,
    and a warning said it once)."""
    global _lib, _failed
    if _lib is not None or _failed is not None:
        return _lib
    with _lock:
        if _lib is None and _failed is None:
            try:
                _lib = _load()
            except Exception as exc:  # noqa: BLE001 - any failure means: use the Inductor kernel
                _failed = f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"lossscale_bench.numerics: the C rounding kernel is not available ({_failed}); "
                    "using the compiled torch kernel (same results)",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return _lib


class ProbeChecked:
    """A C function of the library that is used only once it matched its eager torch kernel on the probe
    values (``fp8.NativeKernel``, ``block_scaling.NativeBlock``): built, loaded and checked on the first
    ``ready()``, and never again after a failure (``broken`` says why; a warning said it once)."""

    #: the library's function
    function = ""

    def __init__(self) -> None:
        self._fn = None
        #: why the C function is not used (no library, or it differed on the probe); None while it works or untried
        self.broken: str | None = None

    def describe(self) -> str:
        """What the warning calls it."""
        return self.function

    def matches_probe(self) -> bool:
        """Run ``self._fn`` on the probe values and compare with the eager kernel, bit for bit."""
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether the C function may be used: loaded and checked on the first call, the answer kept."""
        if self._fn is not None:
            return True
        if self.broken is not None:
            return False
        lib = library()
        if lib is None:
            self.broken = failure()
            return False
        self._fn = getattr(lib, self.function)
        if not self.matches_probe():
            self._fn = None
            self.broken = "differs from the eager kernel on the probe values"
            warnings.warn(
                f"lossscale_bench.numerics: the C {self.describe()} {self.broken}; using the compiled "
                "torch kernel (same results)",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        return True
