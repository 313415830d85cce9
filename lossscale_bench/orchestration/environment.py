"""The environment variables a run reads, checked before anything trains: one line for each value
that would be refused or misread.

Why here and not only where each is read: the kernels read ``LSBENCH_NO_NATIVE`` and
``LSBENCH_NO_COMPILE``, the data loader ``LSBENCH_DECODE_CACHE_MB``, inside the trial (under Ray in
another process), where a bad value would fail every trial after the study started; the allocator
setting and the CPU pins are read in the trial's process too. ``lsbench validate`` and ``lsbench run`` both ask :func:`environment_problems`, so a
misspelt switch is found before a study trains hours with another setting than the one asked for.
Torch-free: ``validate`` does not import torch (the allocator's check does, and only when that
variable is set).
"""

from __future__ import annotations

import os

__all__ = ["environment_problems"]


def environment_problems(study=None) -> list[str]:
    """One line per variable in ``os.environ`` set to a value its reader does not take (the switches and
    numbers of :mod:`lossscale_bench.core.env_vars`, the allocator setting); with a ``repeatable`` study,
    also each CPU pin set otherwise (:func:`lossscale_bench.core.portable.pin_problems`)."""
    from ..core.env_vars import env_problems

    out = []
    if os.environ.get("LSBENCH_MALLOC", "").strip():
        from ..backends.host_memory import setting_problem

        problem = setting_problem()
        if problem:
            out.append(problem)
    out += env_problems()
    if study is not None and study.resources.repeatable:
        from ..core.portable import pin_problems

        out += pin_problems()
    return out
