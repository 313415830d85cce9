"""Whether the CPU's host shortcuts are taken: a switch that makes the CPU run the code path an accelerator runs.

On the CPU a few places compute with Python floats or read a tensor where an accelerator keeps the work on
the device (the scalers' fp32 rules on floats, ``scaling/host_fp32.py``; the loss's sparse matching and its
degenerate-box check): reading a CPU tensor costs no synchronisation there, and a dispatch of a 0-d tensor
operation costs more than the float operation. The values are the same bit for bit (each place's tests
compare both paths), but the number of host reads and of dispatched operations is not. A test or a
measurement of what a step costs on an accelerator (``tests/scaling/test_step_budget.py``) switches the
shortcuts off with :func:`device_path` and counts on the CPU what the accelerator's path does.

Torch-free: callers pass tensors, and only their ``device.type`` is looked at.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["host_shortcuts", "on_host", "device_path"]

_enabled = True


def host_shortcuts() -> bool:
    """True unless inside :func:`device_path`: CPU tensors may take the host shortcuts."""
    return _enabled


def on_host(*tensors) -> bool:
    """True when the host shortcuts are on and every tensor given (None is skipped) lives on the CPU."""
    return _enabled and all(t is None or t.device.type == "cpu" for t in tensors)


@contextmanager
def device_path() -> Iterator[None]:
    """Within the block, CPU tensors take the path an accelerator takes (no host shortcut)."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before
