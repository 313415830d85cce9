"""The faster step, measured side by side: torchvision's per-image SSD loss against the
batched one, and the losses read every step against every ``log_every`` steps.

Two tables, both interleaved (each repeat runs every variant once, in a rotated order, so load
on a shared machine hits all of them alike); each reports the median over repeats, the spread
(lowest and highest repeat) and the ratio to the first variant.

* **step**: ssd_tiny training steps through ``Trainer.run`` with the metrics and divergence
  hooks, per variant: torchvision's loss with a per-step read and for-loop SGD (the old
  step), then the batched loss, then reads every 10 steps, then foreach SGD (the new CPU
  default). Each repeat is ``--steps`` steps (a multiple of 10), timed as a block.
* **loss**: anchor matching plus multibox loss, forward and backward, alone, on random head
  outputs for ssd_tiny's, SSD300's and SSD512's default boxes: the part the batched loss replaces.

    .venv/bin/python benchmarks/step_speed.py --repeats 7 --steps 20

On CPU a "read" costs little (the device is the host); on CUDA it is a wait for the queue,
which is what ``sync_every`` removes. Prints markdown for docs/records/index.md.
"""

from __future__ import annotations

import json
import sys
import time
from itertools import cycle
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, interleave, parser, summary  # noqa: E402

STEP_VARIANTS = {  # name: (batched_loss, sync_every, foreach SGD)
    "torchvision loss, read every step": (False, 1, False),
    "batched loss, read every step": (True, 1, False),
    "batched loss, read every 10 steps": (True, 10, False),
    "batched loss, read every 10, foreach SGD": (True, 10, True),
}
#: (model, image size, feature-map sizes) for the loss-only table
LOSS_GEOMETRIES = (
    ("ssd_tiny", 128, [16, 8, 4, 2]),
    ("ssd300_vgg16", 300, [38, 19, 10, 5, 3, 1]),
    ("ssd512_vgg16", 512, [64, 32, 16, 8, 4, 2, 1]),
)


def batches(size: int, n: int, count: int, seed: int = 0) -> list:
    """``count`` batches of ``n`` random images with 0 to 6 random boxes each."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        images = [torch.rand(3, size, size, generator=g) for _ in range(n)]
        targets = []
        for _ in range(n):
            k = int(torch.randint(0, 7, (1,), generator=g))
            xy = torch.rand(k, 2, generator=g) * size * 0.6
            wh = 8 + torch.rand(k, 2, generator=g) * size * 0.35
            targets.append(
                {
                    "boxes": torch.cat([xy, (xy + wh).clamp(max=size - 1)], 1),
                    "labels": torch.randint(1, 4, (k,), generator=g),
                }
            )
        out.append((i, images, targets))
    return out


def build_trainer(batched: bool, sync_every: int, foreach: bool, size: int, data: list):
    from lossscale_bench.backends import get_backend
    from lossscale_bench.engine import DivergenceHook, MetricsHook, Trainer
    from lossscale_bench.engine.schedule import build_optimizer, build_scheduler
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.models import build_model
    from lossscale_bench.precision import get_precision
    from lossscale_bench.scaling import build_scaler

    torch.manual_seed(0)
    backend = get_backend("cpu")
    model = backend.prepare_model(build_model("ssd_tiny", num_classes=4, image_size=size, batched_loss=batched))
    precision = get_precision("fp32")
    sched = {"lr": 1e-3, "momentum": 0.9, "weight_decay": 5e-4}
    opt = build_optimizer(model, sched, {"foreach": True} if foreach else {"foreach": False})
    sink = MemorySink()
    hooks = [MetricsHook(sink, log_every=sync_every), DivergenceHook(sink, check_every=sync_every)]
    return Trainer(
        model=model,
        optimizer=opt,
        scheduler=build_scheduler(opt, sched),
        scaler=build_scaler({"method": "none"}, model),
        backend=backend,
        precision=precision,
        batches=cycle(data),
        iterations=0,
        hooks=hooks,
        sync_every=sync_every,
    )


def step_table(repeats: int, steps: int, size: int, batch: int) -> dict[str, list[float]]:
    data = batches(size, batch, 10)
    trainers = {name: build_trainer(*v, size=size, data=data) for name, v in STEP_VARIANTS.items()}

    def block(tr):
        def run(rnd: int = 0) -> float:
            tr.iterations += steps
            t0 = time.perf_counter()
            tr.run()
            return (time.perf_counter() - t0) / steps

        return run

    for tr in trainers.values():  # warm-up: one window each
        block(tr)()
    return interleave({n: block(tr) for n, tr in trainers.items()}, repeats)


def loss_table(repeats: int, batch: int) -> dict[str, list[float]]:
    from torchvision.models.detection.image_list import ImageList
    from torchvision.models.detection.ssd import SSD
    from torchvision.ops import boxes as box_ops

    from lossscale_bench.models import build_model
    from lossscale_bench.models.multibox_loss import match_anchors, multibox_loss, pad_targets

    runs = {}
    for name, size, maps in LOSS_GEOMETRIES:
        model = build_model("ssd_tiny", num_classes=21, image_size=size, batched_loss=False)
        if name != "ssd_tiny":  # anchors only: the generator of that model, no backbone built
            from lossscale_bench.models.ssd import CHAINERCV_SSD300, CHAINERCV_SSD512, _anchors

            model.anchor_generator = _anchors(CHAINERCV_SSD300 if size == 300 else CHAINERCV_SSD512, size, False)
        images = ImageList(torch.zeros(batch, 3, size, size), [(size, size)] * batch)
        anchors = model.anchor_generator(images, [torch.zeros(batch, 1, m, m) for m in maps])
        ((_, _, targets),) = batches(size, batch, 1, seed=1)[:1]
        a = anchors[0].shape[0]
        g = torch.Generator().manual_seed(2)
        reg = torch.randn(batch, a, 4, generator=g).requires_grad_()
        logits = torch.randn(batch, a, 21, generator=g).requires_grad_()
        head = {"bbox_regression": reg, "cls_logits": logits}

        def tv(rnd=0, model=model, targets=targets, anchors=anchors, head=head) -> float:
            t0 = time.perf_counter()
            matched = []
            for an, t in zip(anchors, targets):
                if t["boxes"].numel() == 0:
                    matched.append(torch.full((an.size(0),), -1, dtype=torch.int64))
                else:
                    matched.append(model.proposal_matcher(box_ops.box_iou(t["boxes"], an)))
            sum(SSD.compute_loss(model, targets, head, anchors, matched).values()).backward()
            return time.perf_counter() - t0

        def bt(rnd=0, model=model, targets=targets, anchors=anchors, head=head) -> float:
            t0 = time.perf_counter()
            an = torch.stack(anchors)
            boxes, labels, valid = pad_targets(targets, an.device)
            matched = match_anchors(boxes, valid, an, model.proposal_matcher.high_threshold)
            sum(
                multibox_loss(
                    head["bbox_regression"],
                    head["cls_logits"],
                    an,
                    boxes,
                    labels,
                    matched,
                    model.box_coder,
                    model.neg_to_pos_ratio,
                ).values()
            ).backward()
            return time.perf_counter() - t0

        runs[f"{name} ({a} anchors), torchvision"] = tv
        runs[f"{name} ({a} anchors), batched"] = bt
        tv(), bt()  # warm-up
    return interleave(runs, repeats)


def _rows(times: dict[str, list[float]], base_of) -> list[dict]:
    rows = []
    for name, ts in times.items():
        st = summary(ts, 1e3)
        base = summary(times[base_of(name)], 1e3)["median"]
        rows.append(
            {
                "variant": name,
                "median_ms": st["median"],
                "min_ms": st["min"],
                "max_ms": st["max"],
                "ratio": st["median"] / base,
                "repeats": st["n"],
            }
        )
    return rows


def _table(rep: Report, rows: list[dict], what: str, base: str) -> None:
    rep.table(
        [what, "median (ms)", "spread over repeats (ms)", f"ratio to {base}"],
        [
            [r["variant"], f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}-{r['max_ms']:.2f}", f"{r['ratio']:.3f}"]
            for r in rows
        ],
        name=what,
    )


def main() -> None:
    ap = parser(__doc__, repeats=7)
    ap.add_argument("--steps", type=int, default=20, help="steps per timed block (a multiple of 10)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a demo trial runs with 1)")
    ap.add_argument("--skip-step", action="store_true", help="only the loss table")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if args.steps % 10:
        ap.error("--steps must be a multiple of 10 (the read window)")
    torch.set_num_threads(args.threads)
    rep = Report.from_args(args)
    rep.note(
        f"cpu, torch {torch.__version__}, {torch.get_num_threads()} threads, {args.repeats} interleaved "
        f"repeats, batch {args.batch}"
    )
    result = {}
    if not args.skip_step:
        first = next(iter(STEP_VARIANTS))
        rows = _rows(step_table(args.repeats, args.steps, args.image_size, args.batch), lambda n: first)
        result["step"] = rows
        rep.note(f"\nssd_tiny training step ({args.image_size} px, fp32, {args.steps} steps per repeat):\n")
        _table(rep, rows, "step", "torchvision loss, read every step")
    rows = _rows(loss_table(args.repeats, args.batch), lambda n: n.rsplit(", ", 1)[0] + ", torchvision")
    result["loss"] = rows
    rep.note("\nmatching + multibox loss, forward and backward (21 classes):\n")
    _table(rep, rows, "default boxes, loss", "torchvision's on the same boxes")
    rep.data.update(result)
    rep.finish()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
