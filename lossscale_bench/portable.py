"""Same seed, same numbers across x86 machines: pin the CPU kernels' instruction set.

Why a trial differs between CPUs: torch picks its CPU kernels by the best vector instruction set
the machine has (ATen's ``DEFAULT``/``AVX2``/``AVX512`` builds of each kernel) and oneDNN, which
runs the convolutions, does the same with its own ISA levels. Wider vectors sum in a different
order, and fp32 sums in a different order round differently; training amplifies the last-bit
differences into different weights (issue 28: the FP32 seeds gave 44.0, 42.6, 46.5 on an AVX2 EPYC
and 41.0, 41.7, 49.2 on an AVX-512 machine for the same trial ids). Both libraries let the
environment cap the level they pick: ``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA``. Capping
both at AVX2 (with FMA; every x86-64 server CPU since 2013-15) gives every such machine the same
kernels. Both are read when torch first needs them, so they must be in the environment before
torch is imported, in every process that trains: ``lsbench run --portable-cpu`` sets them in its
own environment first thing, and the local Ray instance it starts, and so every worker, inherits
them (a cluster joined with ``--address`` keeps its own environment: set them there).

What it cannot promise: the same numbers as a run *without* the switch on an AVX-512 machine (that
run used other kernels), nor across torch or oneDNN versions, thread counts (``cpus_per_trial``
sets them), or non-x86 CPUs. Cost: none on an AVX2 machine (it already picks AVX2); on an AVX-512
machine, the convolutions lose their wider vectors (not measured here: this machine is AVX2).

Torch-free on purpose: the CLI calls :func:`pin` before anything imports torch.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

#: the environment a portable run sets (values as torch and oneDNN spell them)
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def pin(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`PORTABLE_ENV` in ``environ`` (default ``os.environ``) and return what was set.

    A value the user already set wins (someone pinning ``default`` on purpose keeps it)."""
    env = os.environ if environ is None else environ
    done = {}
    for key, value in PORTABLE_ENV.items():
        if not env.get(key):
            env[key] = value
            done[key] = value
    return done


def describe() -> str:
    """The kernel level torch uses in this process, and the caps in its environment, for the
    trial's ``lsbench.backend`` tag (so a reader knows which numbers should match which)."""
    import torch

    caps = ", ".join(f"{k}={os.environ[k]}" for k in PORTABLE_ENV if os.environ.get(k))
    return f"ATen {torch.backends.cpu.get_cpu_capability()}" + (f" ({caps})" if caps else "")
