"""What the Hadamard option's transforms cost a step (issue 32, item 4): not a test.

The weight-gradient Hadamard transform (``wgrad_hadamard: true``) applies ``H`` and then ``H^T`` to every
conv gradient of a step as a ``[tokens, channels]`` matrix (``numerics/hadamard.py``). This times, per
gradient shape of an ssd_tiny step (width 16, batch 8, 96 px: the FP4 studies' model), one transform:
the batched 16x16 ``torch.matmul`` the code used before (with its zero padding), ``products`` as a step
calls it (the C loop ``lsb_hadamard16`` where it builds), and its torch code (the path without the C
loop, ``LSBENCH_NO_NATIVE=1``); then a step's totals over both directions, beside the NVFP4 rounding of the
transformed gradient the option adds. Best of 5 repeats of ``--calls`` calls, one thread, the trial's
memory setting (freed memory kept).

    .venv/bin/python benchmarks/hadamard_speed.py
"""
import argparse
import time

import torch
import torch.nn.functional as F

from lossscale_bench.backends.host_memory import keep_freed_memory
from lossscale_bench.numerics import hadamard
from lossscale_bench.numerics.hadamard import H16, products
from lossscale_bench.precision import get_precision

#: (tokens, channels): calls a step, the conv gradients of ssd_tiny (width 16, batch 8, 96 px)
STEP_SHAPES = {(73728, 16): 1, (18432, 32): 1, (4608, 32): 1, (1152, 32): 1, (1152, 16): 2, (288, 64): 2,
               (288, 24): 2, (72, 64): 1, (72, 24): 2, (32, 64): 1, (32, 16): 2}


def best_us(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    fmt = get_precision("e4m3fwd-nvfp4grad-emulated", wgrad_hadamard=True).grad_format
    native = hadamard._NATIVE.ready()
    print(f"C loop: {'used' if native else 'not available (' + str(hadamard._NATIVE.broken) + ')'}\n")
    print("| gradient [tokens, channels] | calls a step | matmul (before), µs | products (C), µs | torch code, µs "
          "| NVFP4 rounding of H g, µs |")
    print("|---|---|---|---|---|---|")
    total = {"matmul": 0.0, "C": 0.0, "torch": 0.0, "round": 0.0}
    for (k, c), m in STEP_SHAPES.items():
        x = torch.randn(k, c)
        padded = k + -k % 16
        t = products(H16, x, padded)
        view = t.reshape(1, 1, padded, c).permute(0, 3, 1, 2)
        row = {"matmul": best_us(lambda: torch.matmul(H16, F.pad(x, (0, 0, 0, padded - k)).reshape(-1, 16, c)),
                                 args.calls),
               "C": best_us(lambda: products(H16, x, padded), args.calls),
               "torch": best_us(lambda: hadamard._products_torch(H16, x, padded), args.calls),
               "round": best_us(lambda: fmt.round(view), args.calls)}
        for key, v in row.items():
            total[key] += m * v * (1 if key == "round" else 2)  # the transforms run both ways
        print(f"| {k} × {c} | {m} | {row['matmul']:.0f} | {row['C']:.0f} | {row['torch']:.0f} | {row['round']:.0f} |")
    print(f"\nA step (both directions of every transform; the rounding once): matmul {total['matmul'] / 1e3:.2f} ms, "
          f"products {total['C'] / 1e3:.2f} ms, torch code {total['torch'] / 1e3:.2f} ms; "
          f"the added NVFP4 rounding {total['round'] / 1e3:.2f} ms")


if __name__ == "__main__":
    main()
