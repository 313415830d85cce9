"""Scale-like options that cannot mean what the row's label says are refused at validation.

Every loss scale, initial scale and bound on a scale lies in fp32's normal range (``fields.Scale``):
past fp32's largest value every step overflowed and the trial was reported ``finished``, and the
per-layer scalers failed with torch's raw "value cannot be converted to type float without
overflow". An amax ``margin`` is bounded by the precision's gradient format (``methods.amax.max_margin``):
``margin: 1000`` made every scale 0 in fp32, kept the layer scales at 1 and trained as "no loss scale"
under the label "amax (current, margin=1000)"; larger margins failed with a raw OverflowError.
"""

from __future__ import annotations

import pytest

from helpers import lsbench, one_entry_study
from lossscale_bench.core.float_ranges import FP32
from lossscale_bench.study import StudyError, load_study_text
from lossscale_bench.study.methods.amax import max_margin

FP32_RANGE = (
    "numbers 1.1754943508222875e-38 <= x <= 3.4028234663852886e+38 (fp32's normal range, where loss scales are kept)"
)

#: (entry, precision, the field refused, what the error says, what it allows)
REFUSED = [
    ("{method: fixed, scale: 1.0e+39}", "fp16-emulated", "scale", "1e+39 is out of range", FP32_RANGE),
    ("{method: fixed, scale: 1.0e-39}", "fp16-emulated", "scale", "1e-39 is out of range", FP32_RANGE),
    ("{method: dynamic, init_scale: 1.0e+39}", "fp16-emulated", "init_scale", "out of range", FP32_RANGE),
    ("{method: dynamic, style: deepspeed, min_scale: 1.0e-40}", "mixed16", "min_scale", "out of range", FP32_RANGE),
    ("{method: layerwise_dynamic, init_scale: 1.0e+39}", "fp16-emulated", "init_scale", "out of range", FP32_RANGE),
    ("{method: layerwise_dynamic, max_scale: 1.0e+39}", "fp16-emulated", "max_scale", "out of range", FP32_RANGE),
    ("{method: layerwise_dynamic, min_scale: 1.0e-39}", "fp16-emulated", "min_scale", "out of range", FP32_RANGE),
    ("{method: amax, init_scale: 1.0e+39}", "fp8-emulated", "init_scale", "out of range", FP32_RANGE),
    ("{method: adaptive, init_scale: 1.0e+39}", "fp16-emulated", "init_scale", "out of range", FP32_RANGE),
    (
        "{method: adaptive, scale_upper_bound: 1.0e+39}",
        "fp16-emulated",
        "scale_upper_bound",
        "out of range",
        FP32_RANGE,
    ),
    (
        "{method: adaptive, accum_upper_bound: 1.0e+39}",
        "fp16-emulated",
        "accum_upper_bound",
        "out of range",
        FP32_RANGE,
    ),
    ("{method: saturation, init_scale: 1.0e+39}", "fp8-e4m3-emulated", "init_scale", "out of range", FP32_RANGE),
    (
        "{method: amax, recipe: current, margin: 1000}",
        "fp16-emulated",
        "margin",
        "1000 is out of range for fp16-emulated (fp16 gradients): 2**1000 is past fp32's largest value",
        "integers 0 <= x <= 39",
    ),
    (
        "{method: amax, recipe: current, margin: 2000}",
        "fp16-emulated",
        "margin",
        "2000 is out of range",
        "integers 0 <= x <= 39",
    ),
    (
        "{method: amax, margin: 40}",
        "fp16-emulated",
        "margin",
        "40 is out of range for fp16-emulated (fp16 gradients): the largest gradient would be put at 65504 / 2**40, "
        "below fp16's smallest subnormal",
        "integers 0 <= x <= 39",
    ),
    ("{method: amax, margin: 32}", "fp8-emulated", "margin", "(e5m2 gradients)", "integers 0 <= x <= 31"),
    ("{method: amax, margin: 18}", "fp8-e4m3-emulated", "margin", "(e4m3 gradients)", "integers 0 <= x <= 17"),
    ("{method: amax, margin: 128}", "bf16", "margin", "2**128 is past fp32's largest value", "integers 0 <= x <= 127"),
    ("{method: amax, margin: 40}", "fp32", "margin", "(fp16 gradients)", "integers 0 <= x <= 39"),
    # plain E2M1: 6 / 2**4 is below its one subnormal, 0.5
    (
        "{method: amax, margin: 4}",
        "e4m3fwd-e2m1grad-emulated",
        "margin",
        "4 is out of range for e4m3fwd-e2m1grad-emulated (e2m1 gradients): the largest gradient would be put at "
        "6 / 2**4, below e2m1's smallest subnormal (0.5)",
        "integers 0 <= x <= 3",
    ),
    # NVFP4 and MXFP4 scale each block to the format's maximum: only fp32 bounds the margin (the E2M1 reason was
    # given for these too, with a bound of 3)
    (
        "{method: amax, margin: 128}",
        "e4m3fwd-nvfp4grad-emulated",
        "margin",
        "128 is out of range for e4m3fwd-nvfp4grad-emulated (nvfp4 gradients): 2**128 is past fp32's largest value",
        "integers 0 <= x <= 127",
    ),
    (
        "{method: amax, margin: 128}",
        "nvfp4fwd-mxfp4grad-emulated",
        "margin",
        "128 is out of range for nvfp4fwd-mxfp4grad-emulated (mxfp4 gradients): 2**128 is past fp32's largest value",
        "integers 0 <= x <= 127",
    ),
]


def test_lsbench_validate_refuses_each_out_of_range_scale_in_one_line(tmp_path):
    """One ``lsbench validate`` over a file per case: exit 2, one line per file naming the file, the
    field, the value and the allowed range; no traceback."""
    files = []
    for k, (entry, precision, *_) in enumerate(REFUSED):
        f = tmp_path / f"s{k}.yaml"
        f.write_text(one_entry_study(entry, precision))
        files.append(f)
    r = lsbench("validate", "--schema-only", *files, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr and " ok " not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == len(REFUSED), r.stderr
    for f, line, (entry, _precision, field, problem, allowed) in zip(files, lines, REFUSED):
        assert line.startswith(f"lsbench: error: {f}: scaling[0].{field}: "), (entry, line)
        assert problem in line and line.endswith(f"; allowed: {allowed}"), (entry, line)


@pytest.mark.parametrize(
    "entry,precision",
    [
        (f"{{method: fixed, scale: {FP32.max!r}}}", "fp16-emulated"),
        (f"{{method: fixed, scale: {FP32.min_normal!r}}}", "fp16-emulated"),
        (
            "{method: layerwise_dynamic, min_scale: 1.1754943508222875e-38, max_scale: 3.4028234663852886e+38}",
            "fp16-emulated",
        ),  # fairscale's own defaults, written out
        ("{method: amax, margin: 39}", "fp16-emulated"),
        ("{method: amax, margin: 39}", "fp32"),
        ("{method: amax, margin: 31}", "fp8-emulated"),
        ("{method: amax, margin: 17}", "fp8-e4m3-emulated"),
        ("{method: amax, margin: 17, grad_blocks: mx32}", "fp8-e4m3-emulated"),
        ("{method: amax, margin: 127}", "bf16"),
        ("{method: amax, margin: 8}", "mixed16"),
        ("{method: amax, margin: 3}", "e4m3fwd-e2m1grad-emulated"),
        ("{method: amax, recipe: current, margin: 4}", "e4m3fwd-nvfp4grad-emulated"),
        ("{method: amax, margin: 127}", "nvfp4fwd-nvfp4grad-emulated"),
        ("{method: amax, recipe: current, margin: 4}", "e4m3fwd-mxfp4grad-emulated"),
        ("{method: amax, margin: 127}", "nvfp4fwd-mxfp4grad-emulated"),
    ],
)
def test_the_edges_of_each_range_pass(entry, precision):
    load_study_text(one_entry_study(entry, precision), source="x.yaml")


def test_an_entry_with_its_own_precision_is_bounded_by_that_precision():
    text = one_entry_study("{method: amax, margin: 20, precision: fp8-e4m3-emulated}", "fp16-emulated")
    with pytest.raises(StudyError) as err:
        load_study_text(text, source="x.yaml")
    assert str(err.value).startswith("x.yaml: scaling[0].margin: 20 is out of range for fp8-e4m3-emulated")
    load_study_text(
        one_entry_study("{method: amax, margin: 20, precision: fp16-emulated}", "fp8-e4m3-emulated"), source="x.yaml"
    )


@pytest.mark.parametrize("fmt", ["fp16", "e5m2", "e4m3", "bf16"])
def test_max_margin_is_where_the_scalers_target_leaves_the_format(fmt):
    """At the bound, the amax rule still puts a gradient of amax 1 inside the format (at or above its
    smallest subnormal) with an fp32 scale above 0; one more and it does not."""
    import torch

    from lossscale_bench.precision.formats import FORMATS
    from lossscale_bench.scaling.amax import scale_from_amax

    f = FORMATS[fmt]
    one, prev = torch.ones(()), torch.full((), -1.0)

    def target(margin):
        s = scale_from_amax(one, prev, f.max, margin, power_of_two=False)
        return float(s) if float(s) > 0 else 0.0  # prev (-1) kept: no scale computed at all

    top = max_margin(fmt)
    assert target(top) >= f.min_subnormal
    assert target(top + 1) < f.min_subnormal


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
def test_block_scaled_fp4_keeps_the_largest_gradient_up_to_fp32s_bound(kind):
    """NVFP4 and MXFP4 put each block's largest element at the format's maximum: a gradient of amax 1,
    scaled by the amax rule at the bound (127), rounds to itself; one more and no scale is computed."""
    import torch

    from lossscale_bench.numerics.fp4 import fp4_round
    from lossscale_bench.scaling.amax import scale_from_amax

    one, prev = torch.ones(()), torch.full((), -1.0)
    top = max_margin("e2m1", block_scaled=True)
    assert top == 127 and max_margin("e2m1") == 3
    for margin in (4, top):
        s = scale_from_amax(one, prev, 6.0, margin, power_of_two=False)
        g = torch.tensor([1.0, 0.5, 0.25, 0.125] * 8) * s
        q = fp4_round(g, kind)
        assert float(q[0]) == pytest.approx(float(s), rel=1e-6) and bool((q != 0).all())
    assert float(scale_from_amax(one, prev, 6.0, top + 1, power_of_two=False)) == -1.0  # prev kept: no scale
