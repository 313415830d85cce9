"""Same seed, same numbers across x86 machines: pin the CPU kernels' instruction set.

Why a trial differs between CPUs (docs/records/index.md "Repeatable across CPUs" has the
measurements): torch picks its own CPU kernels by the widest vector instructions the machine has
(ATen's ``DEFAULT``/``AVX2``/``AVX512`` builds of each kernel: reductions such as the loss's sums),
and oneDNN, which runs every convolution of the SSDs (forward, backward-data, backward-weights), JITs
its kernels for the best ISA it detects. Wider vectors sum in another order, fp32 sums in another
order round differently, and training amplifies the last bits into other weights: the demo's FP32
seeds gave 44.0, 42.6, 46.5 on an AVX2 EPYC and 41.0, 41.7, 49.2 on an AVX-512 machine for the
same trial ids. Measured here, 30 ssd_tiny steps: ATen at ``default`` instead of AVX2, or oneDNN at
SSE4.1 instead of AVX2, or 2 threads instead of 1, each end with other weights; deterministic
algorithms and ``torch.backends.mkldnn.deterministic`` change nothing on the CPU (same weights, so
they are left alone); MKL is not called by these models' training
(``MKL_VERBOSE``: no call). All three libraries let the environment cap the level they pick:
``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA`` and ``MKL_CBWR`` (MKL's reproducibility branch, for
a model that does call it; on a non-Intel CPU MKL runs its AUTO branch instead, its manual says).
Capping them at AVX2 (with FMA: every x86-64 server CPU since 2013-15) gives such machines the same
kernels. The thread count, the other source, is fixed by ``cpus_per_trial`` and in the trial id.

The caps are read when torch (oneDNN, MKL) first needs them, so they must be in the environment of
every process that trains before torch is imported there: a ``repeatable`` study sets them in the
driver's environment first thing (the local executor trains in it; a local Ray inherits it) and
hands them to a cluster joined with ``--address`` as the job's ``runtime_env`` (its nodes do not
inherit the driver's environment; orchestration/cluster.py), and each trial checks, before it trains, that its process runs the
AVX2 kernels (:func:`require_pinned`): a CPU without AVX2, or a process whose torch was imported
before the caps were set, fails the trial with that reason instead of training other numbers.

What it cannot promise: the same numbers as a run *without* the caps on an AVX-512 machine (other
kernels), nor across torch or oneDNN versions or non-x86 CPUs; oneDNN also sizes its blocking from
the caches it detects, which we found no statement about (two machines would tell; one was tested).

Torch-free on purpose: :func:`pin` runs before anything imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

#: the environment a repeatable study sets (values as torch, oneDNN and MKL spell them)
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
#: what ``torch.backends.cpu.get_cpu_capability()`` reports in a pinned process
PINNED_CAPABILITY = "AVX2"
#: the variables their library compares case-sensitively: ATen takes ``avx2`` and ignores ``AVX2``
#: (with a warning of its own, and runs its widest kernels); oneDNN and MKL take either spelling
EXACT_CASE = ("ATEN_CPU_CAPABILITY",)


def _matches(key: str, have: str, want: str) -> bool:
    return have == want if key in EXACT_CASE else have.lower() == want.lower()


def pin_problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line for each pin the environment already sets otherwise than a repeatable study needs
    (as the library reads it: ``ATEN_CPU_CAPABILITY=AVX2`` is ignored by torch); ``[]`` when none."""
    env = os.environ if environ is None else environ
    out = []
    for key, value in PORTABLE_ENV.items():
        have = env.get(key)
        if not have or _matches(key, have, value):
            continue
        if key in EXACT_CASE and have.lower() == value.lower():
            why = (
                f"torch reads {key} in lower case only and ignores {have!r} (it would run its widest "
                f"kernels): set {key}={value} or unset it"
            )
        else:
            why = "unset it (or drop repeatable) and run again"
        out.append(f"resources.repeatable pins {key}={value}, but the environment sets {key}={have}: {why}")
    return out


class PinConflict(Exception):
    """The environment already caps a library at another level than a repeatable study needs."""


def pin(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`PORTABLE_ENV` in ``environ`` (default ``os.environ``); return the variables set.

    A variable already set to another value is a :class:`PinConflict` (one line naming it): a study
    that promises AVX2 numbers must not train at whatever level the shell happened to say."""
    env = os.environ if environ is None else environ
    problems = pin_problems(env)
    if problems:
        raise PinConflict(problems[0])
    done = {k: v for k, v in PORTABLE_ENV.items() if not env.get(k)}
    env.update(done)
    return done


def require_pinned(environ: Mapping[str, str] | None = None) -> None:
    """Raise ``RuntimeError`` unless this process trains with the pinned kernels (a repeatable trial
    calls it before training: one that cannot keep the promise fails with the reason)."""
    import torch

    env = os.environ if environ is None else environ
    wrong = pin_problems(env)
    if wrong:  # the one reason that applies: a value set otherwise (not one of the causes below)
        raise RuntimeError(f"{wrong[0]}; this trial would not give the repeatable numbers")
    missing = [k for k in PORTABLE_ENV if not env.get(k)]
    have = torch.backends.cpu.get_cpu_capability()
    if missing or have != PINNED_CAPABILITY:
        why = (
            f"{', '.join(missing)} not set to the pinned value in this process (a Ray cluster that ignores the "
            "job's runtime_env, or a caller that set up Ray itself)"
            if missing
            else f"torch runs its {have} kernels here, not {PINNED_CAPABILITY} (a CPU without AVX2, a non-x86 "
            "CPU, or torch imported in this process before the pins were set)"
        )
        raise RuntimeError(f"resources.repeatable: {why}; this trial would not give the repeatable numbers")


def describe() -> str:
    """The kernel level torch uses in this process, and the caps in its environment, for the
    trial's ``lsbench.backend`` tag (so a reader knows which numbers should match which)."""
    import torch

    caps = ", ".join(f"{k}={os.environ[k]}" for k in PORTABLE_ENV if os.environ.get(k))
    return f"ATen {torch.backends.cpu.get_cpu_capability()}" + (f" ({caps})" if caps else "")
