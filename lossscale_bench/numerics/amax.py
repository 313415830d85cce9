"""``max |x|`` of a gradient as one pass: what the amax and adaptive scalers read at every scaling point.

Why a module of its own: the amax scaler (margin 1, the default study's row) reads the
amax of the gradient arriving at each of its 15 scaling points on every step, and adaptive reads
it per layer. ``torch.aminmax`` plus two ``abs`` and a ``maximum`` cost ~0.3 ms a call at the
step's sizes on one thread (cProfile of the amax row: ~4 ms a step); the C loop of
:mod:`.native` (``lsb_max_abs_bits``: an integer max over the bit patterns, which vectorises)
does the same in one pass. Same value as the torch expression (a NaN anywhere gives NaN, an inf
gives inf; ``-0.0`` gives ``+0.0``), checked on the probe values before first use; anything the
loop does not take (CUDA, other dtypes, strided tensors, large tensors with several torch
threads, ``LSBENCH_NO_NATIVE``) gets the torch expression.
"""

from __future__ import annotations

import struct

import torch

from .block_scaling import native_takes
from .lazy_compile import same_values
from .native import ProbeChecked
from .native import disabled as native_disabled

_F32 = torch.float32
#: finite values across the range, signed zeros, subnormals, an inf and a NaN, in blocks that the probe
#: runs one at a time (a NaN or inf must not hide the others' maximum)
_PROBE = (
    torch.tensor([0.0, -0.0]),
    torch.tensor([1.5, -3.0, 2.0**-140, -(2.0**100)]),
    torch.tensor([-0.0, 2.0**-149]),
    torch.tensor([1.0, float("inf"), -2.0]),
    torch.tensor([1.0, float("nan"), -float("inf")]),
    torch.tensor([-float("inf"), 3.0]),
    torch.randn(1000, generator=torch.Generator().manual_seed(3)) * 1e-3,
)


def _torch_max_abs(t: torch.Tensor) -> torch.Tensor:
    lo, hi = torch.aminmax(t.detach())
    return torch.maximum(lo.abs(), hi.abs()).to(_F32)


class _MaxAbsLoop(ProbeChecked):
    function = "lsb_max_abs_bits"

    def describe(self) -> str:
        return "max |x| loop"

    def matches_probe(self) -> bool:
        return all(same_values(self(x), _torch_max_abs(x)) for x in _PROBE)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # the bits have no sign, so they fit an int32; a NaN keeps its own bits, which nothing reads
        return torch.tensor(self._fn(x.data_ptr(), x.numel()), dtype=torch.int32).view(_F32)

    def value(self, x: torch.Tensor) -> float:
        """The same value as a Python float (exact: an fp32 value)."""
        return _BITS.unpack(_BITS_I.pack(self._fn(x.data_ptr(), x.numel())))[0]


_LOOP = _MaxAbsLoop()
_BITS, _BITS_I = struct.Struct("<f"), struct.Struct("<i")


def _loop_takes(x: torch.Tensor) -> bool:
    return native_takes(x) and not native_disabled() and _LOOP.ready()


def max_abs(t: torch.Tensor) -> torch.Tensor:
    """``max |t|`` as a 0-d fp32 tensor on ``t``'s device (0 for an empty tensor)."""
    if t.numel() == 0:
        return torch.zeros((), dtype=_F32, device=t.device)
    x = t.detach()
    return _LOOP(x) if _loop_takes(x) else _torch_max_abs(x)


def max_abs_value(t: torch.Tensor) -> float:
    """:func:`max_abs` as a Python float, for a CPU caller that goes on computing on the host (a 0-d tensor
    op costs ~3-8 us of dispatch on the CPU, a float op ~0.1 us): the same value, exactly."""
    if t.numel() == 0:
        return 0.0
    x = t.detach()
    return _LOOP.value(x) if _loop_takes(x) else float(_torch_max_abs(x))
