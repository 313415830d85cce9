"""The environment switches a run reads, checked before anything trains: one line for each value
that would be ignored or misread.

Why here and not where each switch is read: the kernels read ``LSBENCH_NO_NATIVE`` and
``LSBENCH_NO_COMPILE`` inside the trial, and a value they do not know (``LSBENCH_NO_NATIVE=off``,
``=nope``) silently means "on"; the allocator setting and the CPU pins are read in the trial's
process too. ``lsbench validate`` and ``lsbench run`` both ask :func:`environment_problems`, so a
misspelt switch is found before a study trains hours with another setting than the one asked for.
Torch-free: ``validate`` does not import torch (the allocator's check does, and only when that
variable is set).
"""

from __future__ import annotations

import os

__all__ = ["FLAG_SWITCHES", "environment_problems"]

#: on/off switches (read in ``numerics``), and what setting them turns off
FLAG_SWITCHES = {"LSBENCH_NO_NATIVE": "the C rounding loops", "LSBENCH_NO_COMPILE": "every compiled kernel"}
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def environment_problems(study=None) -> list[str]:
    """One line per switch in ``os.environ`` set to a value its reader does not take; with a
    ``repeatable`` study, also each CPU pin set otherwise (:func:`lossscale_bench.core.portable.pin_problems`)."""
    out = []
    if os.environ.get("LSBENCH_MALLOC", "").strip():
        from ..backends.host_memory import setting_problem

        problem = setting_problem()
        if problem:
            out.append(problem)
    for name, what in FLAG_SWITCHES.items():
        value = os.environ.get(name)
        if value is not None and value.strip().lower() not in _ON + _OFF:
            out.append(
                f"{name}={value!r} in the environment: allowed: 1, true, yes, on (turns {what} off) "
                f"or 0, false, no, off, empty or unset (on, the default)"
            )
    if study is not None and study.resources.repeatable:
        from ..core.portable import pin_problems

        out += pin_problems()
    return out
