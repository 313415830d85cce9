"""Time one training step per loss-scaling method, side by side in one run.

Methods: none, fixed (128), dynamic (chainer, interval 10), adaptive
(update_every 1 and 10). Steps are interleaved round-robin (method A step,
method B step, ...) so that machine noise hits every method alike; the
figure of merit is each method's median step time divided by dynamic's.

    .venv/bin/python benchmarks/scaler_overhead.py --models ssd_tiny ssd300_vgg16 --steps 8

Prints a markdown table (paste it into docs/records/index.md with the command).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, interleave, parser  # noqa: E402

__all__ = ["METHODS", "SIZES", "build", "measure", "random_batch", "time_interleaved"]

METHODS = {
    "none": {"method": "none"},
    "fixed 128": {"method": "fixed", "scale": 128.0},
    "dynamic (interval 10)": {"method": "dynamic", "style": "chainer", "interval": 10},
    "adaptive (update_every 1)": {"method": "adaptive", "update_every": 1},
    "adaptive (update_every 10)": {"method": "adaptive", "update_every": 10},
}
SIZES = {"ssd_tiny": (128, 8), "ssd300_vgg16": (300, 2), "ssd512_vgg16": (512, 1), "ssd300_resnet34": (300, 2)}


def random_batch(size: int, n: int, seed: int):
    """``n`` random ``size``-pixel images with one random box each (label 1), fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    images = [torch.rand(3, size, size, generator=g) for _ in range(n)]
    targets = []
    for _ in range(n):
        xy = torch.rand(2, generator=g) * size * 0.5
        wh = 16 + torch.rand(2, generator=g) * size * 0.4
        targets.append(
            {"boxes": torch.cat([xy, xy + wh]).clamp(max=size - 1).unsqueeze(0), "labels": torch.tensor([1])}
        )
    return images, targets


def build(model_name: str, method: dict, precision_name: str, device: str):
    """A Trainer for ``model_name`` (4 classes, seed 0) with the scaling ``method`` in ``precision_name``
    (``name+mx32``: block-scaled gradients; ``name+hadamard``: the FP4 option wgrad_hadamard)."""
    from lossscale_bench.backends import get_backend
    from lossscale_bench.engine.loop import Trainer
    from lossscale_bench.engine.schedule import build_optimizer, build_scheduler
    from lossscale_bench.models import build_model
    from lossscale_bench.precision import get_precision
    from lossscale_bench.scaling import build_scaler

    torch.manual_seed(0)
    size, _ = SIZES[model_name]
    backend = get_backend(device)
    model = backend.prepare_model(build_model(model_name, num_classes=4, image_size=size))
    name, _, extra = precision_name.partition("+")  # "fp8-e4m3-emulated+mx32": block-scaled gradients
    # "e4m3fwd-nvfp4grad-emulated+hadamard": the FP4 precision option wgrad_hadamard
    options = {"wgrad_hadamard": True} if extra == "hadamard" else {"grad_blocks": extra or None}
    precision = get_precision(name, **options)
    precision.prepare(model)
    scaler = build_scaler(method, model)
    sched = {"lr": 1e-4, "momentum": 0.9, "weight_decay": 5e-4}
    opt = build_optimizer(model, sched)
    return Trainer(
        model=model,
        optimizer=opt,
        scheduler=build_scheduler(opt, sched),
        scaler=scaler,
        backend=backend,
        precision=precision,
        batches=iter(()),
        iterations=0,
    )


def time_interleaved(trainers: dict, model_name: str, steps: int, warmup: int) -> dict[str, float]:
    """Median step time per trainer, steps interleaved round-robin (the same order every round) on the
    same batches, one batch per round."""
    size, n = SIZES[model_name]
    batches = [random_batch(size, n, i) for i in range(warmup + steps)]

    def stepper(tr):
        def run(rnd: int) -> float:
            t0 = time.perf_counter()
            tr.train_step(*batches[rnd])
            return time.perf_counter() - t0

        return run

    times = interleave({name: stepper(tr) for name, tr in trainers.items()}, steps, warmup, how="fixed")
    return {name: statistics.median(t) for name, t in times.items()}


def measure(model_name: str, steps: int, warmup: int, precision: str, device: str) -> dict[str, float]:
    """Median step time of every method of :data:`METHODS` on ``model_name``."""
    trainers = {name: build(model_name, m, precision, device) for name, m in METHODS.items()}
    return time_interleaved(trainers, model_name, steps, warmup)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["ssd_tiny", "ssd300_vgg16"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precision", default=None, help="default: fp16-emulated on cpu, mixed16 on cuda")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    precision = args.precision or ("mixed16" if args.device == "cuda" else "fp16-emulated")
    rep = Report.from_args(args)
    rep.note(
        f"device {args.device}, precision {precision}, {args.steps} timed steps after {args.warmup} warm-up, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads\n"
    )
    rows = []
    for model in args.models:
        med = measure(model, args.steps, args.warmup, precision, args.device)
        base = med["dynamic (interval 10)"]
        rows += [
            [f"{model} (batch {SIZES[model][1]}, {SIZES[model][0]} px)", name, f"{t * 1000:.1f}", f"{t / base:.3f}"]
            for name, t in med.items()
        ]
    rep.table(["model", "method", "median step (ms)", "ratio to dynamic"], rows, name="methods")
    rep.finish()


if __name__ == "__main__":
    main()
