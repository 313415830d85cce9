"""What the Hadamard option's transforms cost a step: not a test.

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

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser, time_calls  # noqa: E402

from lossscale_bench.backends.host_memory import keep_freed_memory
from lossscale_bench.numerics import hadamard
from lossscale_bench.numerics.hadamard import H16, products
from lossscale_bench.precision import get_precision

#: (tokens, channels): calls a step, the conv gradients of ssd_tiny (width 16, batch 8, 96 px)
STEP_SHAPES = {
    (73728, 16): 1,
    (18432, 32): 1,
    (4608, 32): 1,
    (1152, 32): 1,
    (1152, 16): 2,
    (288, 64): 2,
    (288, 24): 2,
    (72, 64): 1,
    (72, 24): 2,
    (32, 64): 1,
    (32, 16): 2,
}


def best_us(fn, calls: int) -> float:
    """The best of 5 repeats of ``calls`` calls in a row, per call, in µs."""
    return min(time_calls(fn, 5, per_call=calls)) * 1e6


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    fmt = get_precision("e4m3fwd-nvfp4grad-emulated", wgrad_hadamard=True).grad_format
    native = hadamard._NATIVE.ready()
    rep = Report.from_args(args)
    rep.note(f"C loop: {'used' if native else 'not available (' + str(hadamard._NATIVE.broken) + ')'}\n")
    total = {"matmul": 0.0, "C": 0.0, "torch": 0.0, "round": 0.0}
    rows = []
    for (k, c), m in STEP_SHAPES.items():
        x = torch.randn(k, c)
        padded = k + -k % 16
        t = products(H16, x, padded)
        view = t.reshape(1, 1, padded, c).permute(0, 3, 1, 2)
        row = {
            "matmul": best_us(
                lambda x=x, k=k, c=c, p=padded: torch.matmul(H16, F.pad(x, (0, 0, 0, p - k)).reshape(-1, 16, c)),
                args.calls,
            ),
            "C": best_us(lambda x=x, p=padded: products(H16, x, p), args.calls),
            "torch": best_us(lambda x=x, p=padded: hadamard._products_torch(H16, x, p), args.calls),
            "round": best_us(lambda v=view: fmt.round(v), args.calls),
        }
        for key, v in row.items():
            total[key] += m * v * (1 if key == "round" else 2)  # the transforms run both ways
        rows.append(
            [f"{k} × {c}", m, f"{row['matmul']:.0f}", f"{row['C']:.0f}", f"{row['torch']:.0f}", f"{row['round']:.0f}"]
        )
    rep.table(
        [
            "gradient [tokens, channels]",
            "calls a step",
            "matmul (before), µs",
            "products (C), µs",
            "torch code, µs",
            "NVFP4 rounding of H g, µs",
        ],
        rows,
        name="shapes",
    )
    rep.note(
        "\nA step (both directions of every transform; the rounding once): "
        f"matmul {total['matmul'] / 1e3:.2f} ms, "
        f"products {total['C'] / 1e3:.2f} ms, torch code {total['torch'] / 1e3:.2f} ms; "
        f"the added NVFP4 rounding {total['round'] / 1e3:.2f} ms"
    )
    rep.finish()


if __name__ == "__main__":
    main()
