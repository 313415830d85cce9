"""numerics/amax.py: ``max |x|`` by the C loop equals the torch expression (aminmax) on every case the scalers
meet: signed zeros, subnormals, inf, NaN, layouts the loop takes and those it leaves to torch."""

import pytest
import torch

from lossscale_bench.numerics import amax, native
from lossscale_bench.numerics.lazy_compile import same_values

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"no C kernel here: {native.failure()}")

G = torch.Generator().manual_seed(0)
CASES = {
    "wide": torch.randn(300_001, generator=G) * torch.exp2(torch.randint(-60, 60, (300_001,), generator=G).float()),
    "negative max": torch.tensor([-5.0, 4.0, 0.0]),
    "signed zeros": torch.tensor([-0.0, 0.0, -0.0]),
    "all negative zero": torch.tensor([-0.0, -0.0]),
    "subnormals": torch.tensor([2.0**-149, -(2.0**-140)]),
    "inf": torch.tensor([1.0, -float("inf")]),
    "nan": torch.tensor([float("inf"), float("nan"), 2.0]),
    "channels_last": (torch.randn(4, 8, 5, 3, generator=G)).contiguous(memory_format=torch.channels_last),
    "strided": torch.randn(40, 30, generator=G).t()[::2],
    "fp16": torch.randn(100, generator=G).half() * 1000,
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_loop_gives_the_torch_expression(case, monkeypatch):
    x = CASES[case]
    want = amax._torch_max_abs(x)
    assert same_values(amax.max_abs(x), want)
    assert amax.max_abs(x).shape == () and amax.max_abs(x).dtype == torch.float32
    assert same_values(torch.tensor(amax.max_abs_value(x)), want)  # the host's copy: the same value
    monkeypatch.setenv(native.NO_NATIVE_ENV, "1")  # the torch path gives the same
    assert same_values(amax.max_abs(x), want)
    assert same_values(torch.tensor(amax.max_abs_value(x)), want)


def test_the_loop_runs_for_a_dense_fp32_tensor_and_an_empty_one_is_zero(monkeypatch):
    assert amax._LOOP.ready()
    calls = []
    monkeypatch.setattr(amax._MaxAbsLoop, "__call__", lambda self, x: calls.append(x) or amax._torch_max_abs(x))
    amax.max_abs(CASES["channels_last"])
    amax.max_abs(CASES["strided"])  # not dense: torch's
    assert len(calls) == 1
    assert amax.max_abs(torch.empty(0)).item() == 0.0 and amax.max_abs_value(torch.empty(0)) == 0.0
