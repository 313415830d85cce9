"""What one training step asks of the host: reads of tensor values and dispatched operations.

On an accelerator each read of a device value (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``,
``.cpu()``, ``.numpy()``) waits for the device to finish everything queued, and each dispatched
operation is a kernel launch the host pays for; a step that reads often or launches one batch of small
operations per layer runs at the host's pace, not the device's. :class:`StepCounter` counts both for
the code between its ``__enter__`` and ``__exit__``: operations with a ``TorchDispatchMode`` (every
``aten`` operation that reaches the dispatcher, the reads' ``aten._local_scalar_dense`` included), and
the reads that do not dispatch (``tolist``, ``cpu``, ``numpy``) by wrapping those ``Tensor`` methods. A
``tolist`` or ``numpy`` of what ``.cpu()`` returned is not counted again: on an accelerator the copy was
the read, and the host then converts host memory.

On the CPU the count is of the accelerator's path only with the host shortcuts switched off
(:func:`lossscale_bench.core.host_path.device_path`). What it cannot see: a ``.to(device)`` that is a
device-to-host copy on an accelerator (on the CPU it is no copy), and work in native kernels that does not
dispatch (the CPU's rounding kernels).
"""

from __future__ import annotations

import weakref
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

__all__ = ["StepCounter", "READ_METHODS"]

#: Tensor methods that hand a tensor's values to the host without an ``aten._local_scalar_dense``
READ_METHODS = ("tolist", "cpu", "numpy")


class _OpCounter(TorchDispatchMode):
    def __init__(self, counter: StepCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counter.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


class StepCounter:
    """Counts dispatched ``aten`` operations (:attr:`ops`, by name) and host reads (:attr:`reads`, by kind)
    while entered; may be entered again, the counts then start from zero."""

    def __init__(self) -> None:
        self.ops: Counter = Counter()
        self.reads: Counter = Counter()
        self._mode: _OpCounter | None = None
        self._saved: dict = {}
        self._copies: dict = {}  # id -> weak reference to what .cpu() returned: already read

    @property
    def n_ops(self) -> int:
        """All dispatched operations."""
        return sum(self.ops.values())

    @property
    def n_reads(self) -> int:
        """All host reads: scalar reads (``item``, ``float``, ``bool``, ...) and ``tolist``/``cpu``/``numpy``."""
        return self.ops["aten._local_scalar_dense"] + sum(self.reads.values())

    def _wrap(self, name: str):
        original = self._saved[name]
        reads, copies = self.reads, self._copies

        def method(t, *args, **kwargs):
            ref = copies.get(id(t))
            if ref is None or ref() is not t:
                reads[name] += 1
            out = original(t, *args, **kwargs)
            if name == "cpu":
                if out is t:  # a CPU tensor's .cpu() is itself; an accelerator's is a new tensor
                    with _disable_current_modes():
                        out = t.view_as(t)
                copies[id(out)] = weakref.ref(out)
            return out

        return method

    def __enter__(self) -> StepCounter:
        self.ops.clear()
        self.reads.clear()
        for name in READ_METHODS:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._wrap(name))
        self._mode = _OpCounter(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()
        self._copies.clear()
