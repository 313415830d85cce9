"""What one E4M3 rounding call costs at the sizes a training step uses: not a test.

The default study's E4M3 rows pay, on every step, ~33 rounding calls (each conv/linear output in the
forward and its gradient in the backward, plus one for all parameter gradients). This times, per
tensor size, the call a step makes (``E4M3.round``: the format's rounder and ``round_fp8``'s checks,
then the C kernel of ``numerics/native.py`` where it builds), the same call with the C kernel turned
off (``LSBENCH_NO_NATIVE=1``: ``round_fp8``'s flattening, ``LazyCompiled``'s dispatch, Dynamo and
Inductor's kernel, as before the C kernel), each kernel called directly (C, Inductor), the
eager bit-level kernel, and two references: an fp32 multiply and torch's fp16 round trip (both
vectorised ATen kernels). Tenth-percentile of ``--calls`` timed calls each, one thread.

    .venv/bin/python benchmarks/rounding_call_cost.py
    .venv/bin/python benchmarks/rounding_call_cost.py --blocks

``--blocks``: the block-scaled round trips instead, on channels_last gradients of
a batch of 8 (the CPU layout of every conv's), as ``block_round``/``fp4_round`` are called by a step:
MX32 E4M3 without and with the telemetry's counts, and NVFP4, MXFP4 and plain E2M1 with stochastic
rounding, each with the C loop (``numerics/native.py``) and with it turned off (the Inductor kernel
after flattening into logical order, as before).
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser, percentile, time_calls  # noqa: E402

from lossscale_bench.numerics import fp8
from lossscale_bench.numerics.fp8_formats import SPECS
from lossscale_bench.precision.formats import E4M3

SIZES = (64, 4096, 65536, 294912, 2097152)


def tenth_percentile_us(fn, calls: int) -> float:
    """The tenth percentile of ``calls`` timed calls after 5 untimed ones, in µs."""
    return percentile(time_calls(fn, calls, warmup=5), 0.1) * 1e6


#: [channels, height, width] of channels_last gradients, batch 8: 4096 to 1.2 M elements
BLOCK_SHAPES = ((16, 8, 4), (32, 16, 16), (32, 32, 36), (64, 48, 48))


def blocks(rep: Report, calls: int) -> None:
    from lossscale_bench.numerics import block_scaling, fp4

    key = fp4.Fp4Stream(1).next_key()
    kinds = {
        "MX32 E4M3": lambda x: block_scaling.block_round(x, "e4m3", "mx32"),
        "MX32 E4M3 + counts": lambda x: block_scaling.block_round(x, "e4m3", "mx32", counts=True),
        "NVFP4, stochastic": lambda x: fp4.fp4_round(x, "nvfp4", stochastic=True, key=key),
        "MXFP4, stochastic": lambda x: fp4.fp4_round(x, "mxfp4", stochastic=True, key=key),
        "E2M1, stochastic": lambda x: fp4.fp4_round(x, "e2m1", stochastic=True, key=key),
    }
    rows = []
    for c, h, w in BLOCK_SHAPES:
        x = (torch.randn(8, c, h, w, generator=torch.Generator().manual_seed(0)) * 0.01).contiguous(
            memory_format=torch.channels_last
        )
        cols = []
        for fn in kinds.values():
            for off in ("", "1"):
                os.environ["LSBENCH_NO_NATIVE"] = off
                cols.append(tenth_percentile_us(lambda fn=fn, x=x: fn(x), calls))
        os.environ.pop("LSBENCH_NO_NATIVE")
        rows.append([x.numel()] + [f"{v:.0f}" for v in cols])
    rep.table(["elements"] + [f"{k}: C {side} (us)" for k in kinds for side in ("loop", "off")], rows, name="blocks")


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--blocks", action="store_true", help="the block-scaled round trips instead (module doc)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rep = Report.from_args(args)
    if args.blocks:
        blocks(rep, args.calls)
        rep.finish()
        return
    kernel = fp8.compiled_kernel("bits", SPECS["e4m3"], True)
    native = fp8.native_kernel(SPECS["e4m3"], True)

    def without_native(x):
        os.environ["LSBENCH_NO_NATIVE"] = "1"
        try:
            return E4M3.round(x)
        finally:
            del os.environ["LSBENCH_NO_NATIVE"]

    rows = []
    for numel in SIZES:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0)) * 0.01
        E4M3.round(x)
        kernel(x)  # compiles on the first size
        cols = [
            lambda x=x: x * 2.0,
            lambda x=x: x.half().float(),
            lambda x=x: E4M3.round(x),
            lambda x=x: without_native(x),
            (lambda x=x: native(x)) if native is not None else None,
            lambda x=x: kernel._compiled(x),
            lambda x=x: kernel.eager(x),
        ]
        rows.append([numel] + ["–" if f is None else f"{tenth_percentile_us(f, args.calls):.0f}" for f in cols])
    rep.table(
        [
            "elements",
            "fp32 multiply (us)",
            "fp16 round trip (us)",
            "E4M3.round, as a step calls it (us)",
            "the same, C kernel off (us)",
            "C kernel alone (us)",
            "Inductor kernel alone (us)",
            "eager bit kernel (us)",
        ],
        rows,
        name="sizes",
    )
    rep.finish()


if __name__ == "__main__":
    main()
