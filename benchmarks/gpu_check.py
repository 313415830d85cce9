"""One-command GPU check: what the CPU emulation claims, measured on a real card.

    PYTHONPATH=. python benchmarks/gpu_check.py              # on a CUDA machine (make gpu-check), <= 8 min on one H100
    .venv/bin/python benchmarks/gpu_check.py --cpu-smoke     # tiny sizes on CPU, a minute or two (make gpu-check-smoke)

Sections, each a function writing its numbers into the JSON (each in a module of ``gpu_sections/``:
a and h ``scaler_match``, b ``throughput``, c ``adaptive``, d and g ``probe``, e ``short_run``, f ``memory``;
what they share in ``common``, the markdown in ``render``) (a failing section records
``{"error": ...}`` and the others still run; every section has a hard time budget):

a. ``DynamicLossScaler(style="torch")`` vs ``torch.amp.GradScaler``, step for step, same model copy and
   batches: per-step scale, skipped flags, max abs parameter difference after N steps; pass/fail.
b. SSD300-VGG16 mixed16 images/s at batch 32: lsbench's ``Trainer`` vs a plain torchvision-references
   AMP loop, interleaved, ratio.
c. adaptive (update_every 1 and 10) vs dynamic step time in real fp16 autocast, SSD300 and SSD512.
d. emulation vs reality: per-layer subnormal and flush rates (``telemetry.UnderflowProbe``) of
   fp16-emulated against real fp16 autocast on the same weights and batches, fp8-emulated alongside.
e. a short real-fp16 run of the published SSD512 table's rows (+ fp32) on ssd_tiny with the synthetic data, several seeds.
f. peak memory per method (``torch.cuda.max_memory_allocated``; ``ru_maxrss`` of a fresh process on CPU).
g. section d for SSD512-VGG16 at batch 8 over 10 batches (on CUDA): where real fp16 flushes its gradients.
h. section a with foreach SGD on both sides instead of the backend's fused SGD (is a difference GradScaler's
   fused-optimizer path?).

``--sections`` picks the sections and their order (``gdbcaef`` runs the cheapest answers first);
``--budget`` caps the whole check in seconds (each section's own budget still holds).

Trainers are built directly (models, precision, scaling, engine), not through ``study``/``TrialConfig``,
so the check needs neither pydantic nor Ray nor MLflow; pycocotools is optional (mAP in e).
``--cpu-smoke`` forces the CPU and tiny sizes (``ssd_tiny``, ``fp16-emulated`` where the GPU runs mixed16);
its figures test the script, they are not measurements.

Writes ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` and prints the markdown.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from gpu_sections.adaptive import section_c  # noqa: E402
from gpu_sections.common import SYNC_EVERY, device_name, free_memory, make_config, optimizer_kernels  # noqa: E402
from gpu_sections.memory import memory_one, section_f  # noqa: E402
from gpu_sections.probe import section_d  # noqa: E402
from gpu_sections.render import render_markdown  # noqa: E402
from gpu_sections.scaler_match import section_a  # noqa: E402
from gpu_sections.short_run import section_e  # noqa: E402
from gpu_sections.throughput import section_b  # noqa: E402
from harness import parser  # noqa: E402  (it puts the repository on the path: no PYTHONPATH=. needed)

# a skipped first step (overflow at scale 65536) makes torch warn that the lr schedule stepped first
warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))

#: section key -> function of (the whole config, the section's own config, the output folder)
SECTIONS = {
    "a": lambda cfg, sc, out: section_a(cfg, sc),
    "b": lambda cfg, sc, out: section_b(cfg, sc),
    "c": lambda cfg, sc, out: section_c(cfg, sc),
    "d": lambda cfg, sc, out: section_d(cfg, sc),
    "e": section_e,
    "f": lambda cfg, sc, out: section_f(cfg, sc),
    "g": lambda cfg, sc, out: section_d(cfg, sc),
    "h": lambda cfg, sc, out: section_a(cfg, sc),
}


def parse_args(argv=None) -> argparse.Namespace:
    """The check's command line."""
    ap = parser(__doc__.splitlines()[0], out=False)
    ap.add_argument("--out", default="runs/gpu_check", help="output folder (default runs/gpu_check/)")
    ap.add_argument("--cpu-smoke", action="store_true", help="force the CPU and tiny sizes (tests the script)")
    ap.add_argument("--sections", default="abcdefgh", help="sections to run, in this order (default abcdefgh)")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="the whole check's time budget in seconds (default: 420 on CUDA, 240 for the smoke)",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="CUDA: also time the Trainer with torch.compile'd backbone and heads in section b",
    )
    ap.add_argument("--_memory", help=argparse.SUPPRESS)
    ap.add_argument("--_memory-args", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def meta(cfg: dict) -> dict:
    """What the JSON and the markdown say about the machine, the software and the command."""
    try:
        import torchvision

        tv = torchvision.__version__
    except Exception:  # noqa: BLE001
        tv = "not importable"
    return {
        "device": cfg["device"],
        "device_name": device_name(cfg["device"]),
        "smoke": cfg["smoke"],
        "torch": torch.__version__,
        "torchvision": tv,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "precision": cfg["precision"],
        "lsbench_step": (
            f"batched SSD loss, losses read every {SYNC_EVERY} steps, optimizer "
            f"{optimizer_kernels(cfg['device'])}, "
            f"{'channels_last' if cfg['device'] in ('cpu', 'cuda') else 'NCHW'}"
        ),
        "command": "python " + " ".join(shlex.quote(a) for a in ["benchmarks/gpu_check.py"] + sys.argv[1:]),
        "config": cfg,
    }


def run_sections(cfg: dict, sections: str, res: dict, out_dir: Path, t_start: float) -> None:
    """Each section asked for, in that order, once, within its budget and what is left of the whole
    check's; a failing section records its error and the others still run. The JSON is rewritten
    after each section, so partial results survive a kill."""
    json_path = out_dir / "gpu_check.json"
    for key in SECTIONS:
        if key not in sections:
            res["sections"][key] = {"skipped": "not selected (--sections)"}
    for key in dict.fromkeys(sections):  # the order asked for, each once
        t0 = time.monotonic()
        left = cfg["total_budget_s"] - (t0 - t_start)
        if left < 10:
            res["sections"][key] = {"skipped": f"the whole check's time budget ({cfg['total_budget_s']} s) is spent"}
            continue
        cfg[key]["budget_s"] = min(cfg[key]["budget_s"], left)  # each section's budget is hard; so is the total
        print(f"[gpu_check] section {key} ...", file=sys.stderr, flush=True)
        try:
            r = SECTIONS[key](cfg, cfg[key], out_dir)
        except Exception as exc:  # noqa: BLE001 - one failing section must not lose the others
            r = {
                "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500],
                "traceback": traceback.format_exc()[-3000:],
            }
        r["seconds"] = time.monotonic() - t0
        res["sections"][key] = r
        print(
            f"[gpu_check] section {key}: {'error' if 'error' in r else 'ok'} in {r['seconds']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        free_memory()
        res["meta"]["total_s"] = time.monotonic() - t_start
        json_path.write_text(json.dumps(res, indent=1, default=str))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args._memory:  # child process of section f on CPU
        device, precision, model_name, batch, steps = json.loads(args._memory_args)
        print(json.dumps(memory_one(device, precision, model_name, batch, steps, args._memory)))
        return 0

    if not args.cpu_smoke and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device is visible (torch.cuda.is_available() is False); "
            "run on a GPU machine or pass --cpu-smoke",
            file=sys.stderr,
        )
        return 2

    t_start = time.monotonic()
    cfg = make_config(args.cpu_smoke)
    if args.budget is not None:
        cfg["total_budget_s"] = args.budget
    unknown = sorted(set(args.sections) - set("abcdefgh"))
    if unknown:
        print(
            f"gpu_check: --sections: unknown section(s) {', '.join(unknown)}; allowed: a b c d e f g h", file=sys.stderr
        )
        return 2
    cfg["compile"] = bool(args.compile) and cfg["device"] == "cuda"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg["device"] == "cuda":
        # fp32 rows (section e's baseline) stay fp32: no TF32 in matmuls or convolutions
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    res = {"meta": meta(cfg), "sections": {}}
    run_sections(cfg, args.sections, res, out_dir, t_start)
    res["meta"]["total_s"] = time.monotonic() - t_start
    (out_dir / "gpu_check.json").write_text(json.dumps(res, indent=1, default=str))
    md = render_markdown(res)
    (out_dir / "gpu_check.md").write_text(md + "\n")
    print(json.dumps(res, indent=1, default=str) if args.format == "json" else md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
