"""Lazy ``torch.compile`` with an eager fallback, for the rounding kernels of this package.

Why compile at all: on CPU, torch's eager cast to ``float8_e4m3fn`` costs ~10 ms per 2 M
elements, an eager bit-level rewrite ~3-5 ms, and the same rewrite fused by Inductor's C++ code
generation ~0.5-1 ms (docs/records/index.md). The emulation rounds every activation and
parameter gradient, so that difference is most of an emulated step's overhead.

Why lazily and with a fallback: compiling needs a C++ compiler and takes seconds on first use
(once per process; Inductor's on-disk cache makes later processes faster). A machine without a
compiler, a torch whose Inductor cannot lower one of the ops, or ``LSBENCH_NO_COMPILE=1``
(debugging, or timing the eager path) must still get bit-identical results, only slower. The
compiled and eager functions are the same Python function, so they compute the same thing; the
tests check it bit for bit.

Why each kernel gets its own code object (:func:`_distinct`): Dynamo keeps its compiled
graphs on the function's *code object* and stops compiling after a small number of entries
per code object (``torch._dynamo.config.recompile_limit``, 8), silently running eager from
then on. Kernels built by one factory for several formats and modes share a code object, so a
study using many variants would quietly lose the compiled path; a renamed copy of the code
object gives each variant its own cache. We do not raise the global limit: other code in the
process owns that setting.

Why ``maybe_mark_dynamic`` on dimension 0 and not ``dynamic=True``: gradients of many shapes
go through the same kernel; kernels here take flat 1-D tensors, so one graph with a symbolic
length serves them all (measured: one graph for 20 shapes). ``dynamic=True`` would also turn
every int and float the kernel reads from its closure (a format's max, its exponent range)
into a graph input, i.e. runtime values instead of constants folded into the C++ code, and it
compiled a second graph for the same kernel here. Dynamo specialises sizes 0 and 1, so callers
route tensors with fewer than 2 elements (or blocks) to the eager function.
"""

from __future__ import annotations

import threading
import types
import warnings
from collections.abc import Callable

import torch

#: set to 1 to skip ``torch.compile`` everywhere in this package (eager kernels, same results)
NO_COMPILE_ENV = "LSBENCH_NO_COMPILE"


def compile_disabled() -> bool:
    """Whether ``LSBENCH_NO_COMPILE`` asks for eager kernels (read on every call, so tests and
    benchmarks can switch it without reloading modules)."""
    from ..core.env_vars import env_flag

    return env_flag(NO_COMPILE_ENV)


def _distinct(fn: Callable, tag: str) -> Callable:
    """A copy of ``fn`` with its own code object (module doc: Dynamo's per-code-object cache)."""
    name = f"{fn.__name__}__{tag}".replace("-", "_").replace(".", "_")
    code = fn.__code__.replace(co_name=name)
    copy = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    copy.__doc__ = fn.__doc__
    return copy


def same_values(a, b) -> bool:
    """Bit for bit equal (so -0.0 differs from 0.0), NaNs at the same places whatever their
    payload; tuples element by element."""
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(same_values, a, b))
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype != torch.float32:
        return torch.equal(a, b)
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na].view(torch.int32), b[~nb].view(torch.int32))


def _mark_dynamic(args: tuple) -> tuple:
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim():
            torch._dynamo.maybe_mark_dynamic(a, 0)
    return args


def _quiet_cpp_extension() -> None:
    """Keep torch's ``No CUDA runtime is found, using CUDA_HOME=...`` off the terminal.

    Inductor imports ``torch.utils.cpp_extension`` to find a C++ compiler, and that module logs
    this warning on any machine with a CUDA build of torch and no GPU (the local wheel is one):
    a line in every trial's output that says nothing about the run. Only that logger is raised
    to ERROR; its errors still show.
    """
    import logging

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


class LazyCompiled:
    """``fn`` compiled by Inductor on first call (dimension 0 of its inputs symbolic), else ``fn``.

    Calls are autograd-free: the kernels here round values inside hooks and custom autograd
    functions, where no graph is recorded, and compiling an inference-only graph avoids
    AOTAutograd tracing a backward nobody needs. Inputs are detached by the callers.

    The first compiled call runs under a lock so two threads (autograd's worker and the main
    thread, or two hooks) do not compile the same kernel twice. If compiling or running the
    compiled kernel raises while the eager function succeeds on the same input, the kernel is
    marked broken, a warning is issued once, and every later call runs eager.

    ``probe``: inputs on which the compiled kernel must give the eager kernel's values bit for
    bit before it is used. Why: generated code can round differently from eager torch without
    any error (Inductor drops fp32 -> fp16 -> fp32 casts; a build with unsafe math flags could
    fold ``(a + m) - m`` to ``a``); a kernel that fails the probe is marked broken like one that
    failed to compile.

    ``eager`` may be a different function than ``fn`` when the fastest eager code is not the
    best code to fuse (the fp8 kernels); it must compute the same values, which the probe and
    the tests check.
    """

    def __init__(self, fn: Callable, tag: str, eager: Callable | None = None, probe: tuple | None = None) -> None:
        #: what runs when compiling is off or failed (``fn`` unless a faster eager version is given)
        self.eager = fn if eager is None else eager
        self.tag = tag
        self.probe = probe
        self._fn = _distinct(fn, tag)
        self._compiled: Callable | None = None
        #: devices (``cpu``, ``cuda``) on which the compiled kernel has passed the probe
        self._ready: set[str] = set()
        self._broken: str | None = None
        self._lock = threading.Lock()
        #: graphs Inductor compiled for this kernel (recompilations show up here)
        self.graphs = 0

    def _backend(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.graphs += 1
        return compile_fx(gm, example_inputs)

    @property
    def broken(self) -> str | None:
        """Why the compiled path was abandoned (None while it works or was never tried)."""
        return self._broken

    def uses_compiled(self) -> bool:
        """Whether the next call will try the compiled kernel."""
        return self._broken is None and not compile_disabled()

    def _first_call(self, args: tuple, device: str):
        """Compile, check the probe on ``device`` and run ``args``, all under the lock (a thread
        arriving while another compiles waits, then runs the compiled kernel). The probe runs
        once per device type: Inductor generates different code for CPU and CUDA."""
        with self._lock:
            if self._compiled is None:
                _quiet_cpp_extension()
                self._compiled = torch.compile(self._fn, backend=self._backend)
            if device not in self._ready and self.probe is not None:
                probe = tuple(p.to(device) for p in self.probe)
                got = self._compiled(*_mark_dynamic(tuple(p.clone() for p in probe)))
                if not same_values(got, self.eager(*probe)):
                    raise ArithmeticError("compiled kernel differs from the eager kernel on the probe values")
            out = self._compiled(*_mark_dynamic(args))
            self._ready.add(device)
            return out

    def __call__(self, *args):
        if not self.uses_compiled():
            return self.eager(*args)
        device = args[0].device.type if isinstance(args[0], torch.Tensor) else "cpu"
        try:
            # always without grad: Dynamo guards on the grad mode, and the kernels are called with it
            # on (a direct call) and off (inside autograd Functions, hooks and the engine's end-of-backward
            # callback); one mode means one graph per kernel instead of a recompilation per mode
            with torch.no_grad():
                if device not in self._ready:
                    return self._first_call(args, device)
                return self._compiled(*_mark_dynamic(args))
        except Exception as exc:  # noqa: BLE001 - any compiler failure means: run eager
            out = self.eager(*args)  # a genuine error in the inputs raises here, uncaught
            self._broken = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            warnings.warn(
                f"lossscale_bench.numerics: torch.compile failed for {self.tag} "
                f"({self._broken}); using the eager kernel (same results, slower)",
                RuntimeWarning,
                stacklevel=2,
            )
            return out
