"""The torch-free format ranges validation bounds options by are torch's own (``torch.finfo``), and
the runtime formats are built from them (one description of each range)."""

from __future__ import annotations

import pytest
import torch

from lossscale_bench.core.float_ranges import FP32, RANGES
from lossscale_bench.precision.formats import FORMATS

DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_each_range_is_torch_finfo(name):
    r, fi = RANGES[name], torch.finfo(DTYPES[name])
    assert (r.max, r.min_normal, r.min_subnormal) == (fi.max, fi.smallest_normal, fi.smallest_normal * fi.eps)


def test_the_formats_are_built_from_the_ranges():
    assert set(RANGES) == {"fp32"} | {n for n in FORMATS if "-" not in n}
    for name, fmt in FORMATS.items():
        assert RANGES[name.split("-")[0]].fields() == {
            "max": fmt.max,
            "min_normal": fmt.min_normal,
            "min_subnormal": fmt.min_subnormal,
        }
    assert FP32 is RANGES["fp32"]
