"""Step time of the emulated precisions against fp32, side by side in one run.

Each precision gets its own Trainer (same seed, same batches, no loss scale);
steps are interleaved round-robin so machine noise hits every precision
alike. The figure of merit is each precision's median step time divided by
fp32's (the target: every emulated precision <= 1.3x fp32). E4M3 rounding is
compiled by Inductor where a C compiler is found; ``LSBENCH_NO_COMPILE=1``
times the eager fallback.

    .venv/bin/python benchmarks/precision_overhead.py --models ssd_tiny --steps 60 --warmup 5
    .venv/bin/python benchmarks/precision_overhead.py --layouts --steps 40   # NCHW vs channels_last

``--layouts`` instead times fp32 and fp8-emulated with the model in NCHW
(``contiguous_format``) and in channels_last (the CPU backend's default), side
by side. Prints a markdown table (paste it into docs/records/index.md with the command).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser  # noqa: E402
from scaler_overhead import SIZES, build, time_interleaved  # noqa: E402

PRECISIONS = ("fp32", "fp16-emulated", "fp8-emulated", "fp8-e4m3-emulated", "fp8-e4m3-emulated+mx32")


def measure(model_name: str, steps: int, warmup: int, device: str, precisions=PRECISIONS) -> dict[str, float]:
    trainers = {p: build(model_name, {"method": "none"}, p, device) for p in precisions}
    return time_interleaved(trainers, model_name, steps, warmup)


def measure_layouts(model_name: str, steps: int, warmup: int, device: str) -> dict[str, float]:
    trainers = {}
    for prec in ("fp32", "fp8-emulated"):
        for layout, fmt in (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last)):
            tr = build(model_name, {"method": "none"}, prec, device)
            tr.model.to(memory_format=fmt)
            trainers[f"{prec}, {layout}"] = tr
    return time_interleaved(trainers, model_name, steps, warmup)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["ssd_tiny"])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a demo trial runs with 1)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layouts", action="store_true", help="NCHW vs channels_last instead of precisions")
    ap.add_argument(
        "--precisions",
        nargs="+",
        default=list(PRECISIONS),
        help="fp32 and others (name+mx32: block-scaled fp8 gradients; name+hadamard: FP4 wgrad_hadamard)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rep = Report.from_args(args)
    rep.note(
        f"device {args.device}, {args.steps} timed steps after {args.warmup} warm-up, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads\n"
    )
    measure_fn, header, base = (
        (measure_layouts, "precision, layout", "fp32, NCHW")
        if args.layouts
        else (lambda *a: measure(*a, precisions=args.precisions), "precision", "fp32")
    )
    rows = []
    for model in args.models:
        med = measure_fn(model, args.steps, args.warmup, args.device)
        rows += [
            [
                f"{model} (batch {SIZES[model][1]}, {SIZES[model][0]} px)",
                name,
                f"{t * 1000:.1f}",
                f"{t / med[base]:.3f}",
            ]
            for name, t in med.items()
        ]
    rep.table(["model", header, "median step (ms)", f"ratio to {base}"], rows, name="precisions")
    rep.finish()


if __name__ == "__main__":
    main()
