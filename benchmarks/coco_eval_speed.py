"""Time COCO box AP: pycocotools' COCOeval against ``fast_coco.coco_box_stats``, side by side (not a test).

On the default study's val set (``studies/smoke.yaml``: 512 synthetic images, 96 px, 3 classes; read
from the data cache, generated there first if missing) with detections like a detector's after NMS:
``--per-image`` (default 100-200) per image, about a fifth near a true box (jittered, usually the
right class, higher scores), the rest anywhere, scores with two decimals (ties). It times
``evaluate_detections`` as a trial calls it, with ``reference=True`` (pycocotools: ``loadRes``,
``evaluate``, ``accumulate``, ``summarize``) and without (NumPy), and the scoring alone
(``pycocotools_box_stats`` against ``coco_box_stats``, without ``evaluate_detections``' dict
normalisation and top-100 cut, which both sides share), interleaved (A B A B ...) so that a change
in the machine's load hits both; checks that every repeat gives the same 12 stats bit for bit, and
prints each side's times and the ratios of the medians. Where ``faster-coco-eval`` imports (a C++ COCOeval,
not a dependency of the package), its ``COCOeval_faster`` joins the scoring-alone comparison, timed the same way
and its stats compared bit for bit (the measurement in ``evaluation/fast_coco.py``'s module doc).

    python benchmarks/coco_eval_speed.py [--repeat 3] [--per-image 100 200] [--seed 0]

Run it on an otherwise idle machine for numbers to publish; on a loaded one (the figures in the
commit that added it were taken under ``nice -n 19`` beside a running study on 2 cores) the
absolute times are inflated, the ratio less so. The load average is printed with the results.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser  # noqa: E402

from lossscale_bench.data import build_datasets  # noqa: E402
from lossscale_bench.evaluation.coco import evaluate_detections, pycocotools_box_stats  # noqa: E402
from lossscale_bench.evaluation.fast_coco import coco_box_stats  # noqa: E402

SMOKE = Path(__file__).resolve().parents[1] / "lossscale_bench" / "studies" / "smoke.yaml"


def detections(coco, per_image: tuple[int, int], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    cats = sorted(coco.cats)
    dets = []
    for img_id, img in coco.imgs.items():
        size = float(img["width"])
        gts = coco.imgToAnns[img_id]
        for _ in range(int(rng.integers(per_image[0], per_image[1] + 1))):
            if gts and rng.random() < 0.2:
                a = gts[int(rng.integers(len(gts)))]
                box = [v + rng.normal() * 0.08 * max(a["bbox"][2:]) for v in a["bbox"]]
                cat = a["category_id"] if rng.random() < 0.8 else int(rng.choice(cats))
                score = rng.random() ** 0.5
            else:
                w, h = np.exp(rng.uniform(np.log(4), np.log(size), 2))
                box = [rng.uniform(-w / 4, size - w * 0.75), rng.uniform(-h / 4, size - h * 0.75), w, h]
                cat = int(rng.choice(cats))
                score = rng.random() ** 2
            dets.append(
                {
                    "image_id": img_id,
                    "category_id": cat,
                    "bbox": [float(v) for v in box],
                    "score": round(float(score), 2),
                }
            )
    return dets


def faster_coco_eval_stats(coco, dets: list[dict]):
    """faster-coco-eval's ``COCOeval_faster`` (bbox) on ``dets``: the 12 stats, or None where it is not installed.
    Its ground-truth object is built from ``coco.dataset`` on every call (~2 % of the call here)."""
    try:
        from faster_coco_eval import COCO, COCOeval_faster
    except ImportError:
        return None
    gt = COCO(coco.dataset, use_deepcopy=True)
    ev = COCOeval_faster(gt, gt.loadRes([dict(d) for d in dets]), "bbox", print_function=lambda *a, **k: None)
    ev.params.imgIds = sorted(gt.getImgIds())
    with contextlib.redirect_stdout(io.StringIO()):
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return np.asarray(ev.stats[:12], dtype=float)


def main(argv=None) -> int:
    ap = parser(__doc__, repeats=3, repeats_flags=("--repeat",), repeats_help="interleaved repeats")
    ap.add_argument("--per-image", type=int, nargs=2, default=(100, 200), metavar=("MIN", "MAX"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import yaml

    cfg = yaml.safe_load(SMOKE.read_text())["dataset"]
    _, val, _ = build_datasets(cfg)
    coco = val.coco
    dets = detections(coco, tuple(args.per_image), args.seed)
    rep = Report.from_args(args)
    rep.note(
        f"val set: {len(coco.imgs)} images, {len(coco.anns)} objects, {len(coco.cats)} classes "
        f"({cfg['image_size']} px); {len(dets)} detections ({len(dets) / len(coco.imgs):.0f} per image)"
    )
    rep.note(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")

    stats_ref = pycocotools_box_stats(coco, [dict(d) for d in dets])
    stats_fast = coco_box_stats(coco, dets)
    same = np.array_equal(stats_ref, stats_fast)
    rep.note(
        f"12 stats bit for bit equal: {same}  (AP {stats_fast[0]:.4f}, AP50 {stats_fast[1]:.4f}, "
        f"AR100 {stats_fast[8]:.4f})"
    )

    # what a trial pays: evaluate_detections (its dict normalisation and top-100 cut are common to both)
    times = {"pycocotools": [], "fast_coco": []}
    results = {"pycocotools": [], "fast_coco": []}
    # the scoring alone: pycocotools_box_stats (loadRes writes into the dicts: copies made beforehand)
    # against coco_box_stats on the same list
    alone = {"pycocotools": [], "fast_coco": []}
    fce_same = True
    if faster_coco_eval_stats(coco, dets[:1]) is not None:
        alone["faster-coco-eval"] = []
    for _ in range(args.repeats):
        for name, ref in (("pycocotools", True), ("fast_coco", False)):
            t0 = time.perf_counter()
            r = evaluate_detections(coco, dets, reference=ref)
            times[name].append(time.perf_counter() - t0)
            results[name].append(r)
        copies = [dict(d) for d in dets]
        t0 = time.perf_counter()
        s_ref = pycocotools_box_stats(coco, copies)
        alone["pycocotools"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        s_fast = coco_box_stats(coco, dets)
        alone["fast_coco"].append(time.perf_counter() - t0)
        if "faster-coco-eval" in alone:
            t0 = time.perf_counter()
            s_fce = faster_coco_eval_stats(coco, dets)
            alone["faster-coco-eval"].append(time.perf_counter() - t0)
            fce_same = fce_same and np.array_equal(s_fce, s_ref)
        same = same and np.array_equal(s_ref, s_fast) and np.array_equal(s_ref, stats_ref)
    same = same and all(r == results["pycocotools"][0] for rs in results.values() for r in rs)
    rows = []
    for what, tab in (
        ("evaluate_detections (reference=True / default)", times),
        ("the scoring alone: pycocotools_box_stats / coco_box_stats", alone),
    ):
        base = statistics.median(tab["fast_coco"])
        rows += [
            [
                what,
                name,
                f"{statistics.median(ts):.3f}",
                f"{min(ts):.3f}",
                ", ".join(f"{t:.3f}" for t in ts),
                "" if name == "fast_coco" else f"{statistics.median(ts) / base:.1f}x",
            ]
            for name, ts in tab.items()
        ]
    rep.note("")
    rep.table(
        [
            "what",
            "side",
            "median (s)",
            "min (s)",
            f"{args.repeats} interleaved repeats (s)",
            "ratio to fast_coco (medians)",
        ],
        rows,
        name="times",
    )
    rep.note(f"\nstats and results equal in every repeat: {same}")
    if "faster-coco-eval" in alone:
        rep.note(f"faster-coco-eval's 12 stats bit for bit pycocotools' in every repeat: {fce_same}")
    rep.note(f"load average {os.getloadavg()[0]:.2f} at the end")
    rep.finish()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
