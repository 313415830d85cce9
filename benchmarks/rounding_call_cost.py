"""What one E4M3 rounding call costs at the sizes a training step uses (issue 28, item 2): not a test.

The default study's E4M3 rows pay, on every step, ~33 rounding calls (each conv/linear output in the
forward and its gradient in the backward, plus one for all parameter gradients). This times, per
tensor size, the call a step makes (``E4M3.round``: the format's rounder and ``round_fp8``'s checks,
then the C kernel of ``numerics/_native.py`` where it builds), the same call with the C kernel turned
off (``LSBENCH_NO_NATIVE=1``: ``round_fp8``'s flattening, ``LazyCompiled``'s dispatch, Dynamo and
Inductor's kernel, as before issue 28's C kernel), each kernel called directly (C, Inductor), the
eager bit-level kernel, and two references: an fp32 multiply and torch's fp16 round trip (both
vectorised ATen kernels). Tenth-percentile of ``--calls`` timed calls each, one thread.

    .venv/bin/python benchmarks/rounding_call_cost.py
"""
import argparse
import os
import time

import torch

from lossscale_bench.formats import E4M3
from lossscale_bench.numerics import fp8

SIZES = (64, 4096, 65536, 294912, 2097152)


def tenth_percentile_us(fn, calls: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 10] * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    kernel = fp8.compiled_kernel("bits", fp8.SPECS["e4m3"], True)
    native = fp8.native_kernel(fp8.SPECS["e4m3"], True)

    def without_native(x):
        os.environ["LSBENCH_NO_NATIVE"] = "1"
        try:
            return E4M3.round(x)
        finally:
            del os.environ["LSBENCH_NO_NATIVE"]

    print("| elements | fp32 multiply (us) | fp16 round trip (us) | E4M3.round, as a step calls it (us) "
          "| the same, C kernel off (us) | C kernel alone (us) | Inductor kernel alone (us) | eager bit kernel (us) |")
    print("|---|---|---|---|---|---|---|---|")
    for numel in SIZES:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0)) * 0.01
        E4M3.round(x)
        kernel(x)  # compiles on the first size
        cols = [lambda: x * 2.0, lambda: x.half().float(), lambda: E4M3.round(x), lambda: without_native(x),
                (lambda: native(x)) if native is not None else None, lambda: kernel._compiled(x),
                lambda: kernel.eager(x)]
        print(f"| {numel} | " + " | ".join("–" if f is None else f"{tenth_percentile_us(f, args.calls):.0f}"
                                           for f in cols) + " |")


if __name__ == "__main__":
    main()
