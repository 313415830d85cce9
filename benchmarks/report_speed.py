"""Time `lsbench report` on a store with many trial runs (not a test).

Fills a fresh SQLite MLflow store with one study of N trial runs (default
1,000: 2 models x 2 batch sizes x 10 scaling rows x 25 seeds), each with the
params, tags and step/eval/final metrics the trial code writes (one
``log_batch`` per run), then times ``load_runs`` and ``write_report`` for
each format.  Target: write_report under 5 s for 1,000 runs.

    python benchmarks/report_speed.py [--runs 1000] [--steps 50] [--dir DIR]

Filling takes ~3 min on 2 cores (one SQLite commit per MLflow call); pass
``--dir`` to keep the store, and a later run with the same ``--dir`` reuses it.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser, time_calls  # noqa: E402

from lossscale_bench.report import FORMATS, load_runs, write_report  # noqa: E402

STUDY = "bench_study"
ROWS = [
    ("none", "FP32 baseline", "fp32"),
    ("adaptive", "adaptive", "fp16-emulated"),
    ("adaptive", "adaptive (freq=10)", "fp16-emulated"),
    ("fixed", "no loss scale", "fp16-emulated"),
    ("fixed", "loss scale (8)", "fp16-emulated"),
    ("fixed", "loss scale (128)", "fp16-emulated"),
    ("fixed", "loss scale (256)", "fp16-emulated"),
    ("dynamic", "loss scale (dynamic, interval=10)", "fp16-emulated"),
    ("dynamic", "loss scale (dynamic, interval=100)", "fp16-emulated"),
    ("fixed", "loss scale (1024)", "fp16-emulated"),
]


def fill(uri: str, n_runs: int, steps: int) -> None:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    rng = random.Random(0)
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(STUDY)
    parent = client.create_run(exp, tags={"lsbench.role": "study", "lsbench.study": STUDY}).info.run_id
    grid = [(m, bs, r) for m in ("ssd512_vgg16", "ssd300_vgg16") for bs in (8, 32) for r in range(len(ROWS))]
    ts = int(time.time() * 1000)
    for i in range(n_runs):
        model, bs, row = grid[i % len(grid)]
        seed = i // len(grid)
        method, label, precision = ROWS[row]
        status = rng.choices(["finished", "diverged", "failed", "running"], [90, 6, 2, 2])[0]
        tags = {
            "mlflow.parentRunId": parent,
            "lsbench.role": "trial",
            "lsbench.study": STUDY,
            "lsbench.trial_id": f"t{i:05d}",
            "lsbench.status": status,
            "lsbench.label": label,
            "lsbench.row": str(row),
            "lsbench.precision": precision,
            "lsbench.eval_metric": "voc07",
        }
        if status == "diverged":
            tags["lsbench.diverged_step"] = str(rng.randint(1, steps))
        run_id = client.create_run(exp, tags=tags, run_name=f"t{i:05d}").info.run_id
        params = {
            "model": model,
            "batch_size": str(bs),
            "seed": str(seed),
            "precision": precision,
            "scaling.method": method,
            "scaling.scale": "128",
            "scaling.interval": "10",
            "dataset": "voc0712",
            "schedule.iterations": "120000",
            "schedule.lr": "0.001",
            "schedule.momentum": "0.9",
            "schedule.weight_decay": "0.0005",
            "eval.every": "10000",
            "eval.metric": "voc07",
            "backend": "cpu",
        }
        metrics = []
        for s in range(steps):
            for key, value in (
                ("loss", 5.0 / (s + 1)),
                ("loss_scale", 128.0),
                ("skipped_steps", 0.0),
                ("overflow", 0.0),
                ("lr", 1e-3),
                ("images_per_sec", 50.0),
            ):
                metrics.append(Metric(key, value, ts + s, s))
        if status == "finished":
            v = 0.78 + 0.01 * rng.random()
            metrics += [
                Metric("map", v, ts, steps),
                Metric("map_50", v, ts, steps),
                Metric("final_map", v, ts, steps),
                Metric("final_map_50", v, ts, steps),
                Metric("best_map", v, ts, steps),
            ]
        client.log_batch(
            run_id,
            metrics=metrics[:1000],
            params=[Param(k, v) for k, v in params.items()],
            tags=[RunTag("mlflow.source.name", "bench")],
        )
        if status != "running":
            client.set_terminated(run_id, "FAILED" if status == "failed" else "FINISHED")


def main(argv=None) -> int:
    ap = parser(__doc__, repeats=1, repeats_help="timings of each report format after the first call")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=50, help="logged steps per run (6 step metrics each)")
    ap.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to put the store (default: a temp dir); an existing store there is reused",
    )
    args = ap.parse_args(argv)

    rep = Report.from_args(args)
    root = (args.dir or Path(tempfile.mkdtemp(prefix="report_speed_"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{root}/mlflow.db"
    if (root / "mlflow.db").exists():
        rep.note(f"reusing the store at {uri} (delete it to refill)")
    else:
        t = time.perf_counter()
        fill(uri, args.runs, args.steps)
        rep.note(f"filled {args.runs} trial runs ({args.steps} steps each) in {time.perf_counter() - t:.1f} s: {uri}")

    t = time.perf_counter()
    df = load_runs(uri, STUDY)  # first call also pays mlflow's import and store start-up
    rows = [["load_runs (first call, incl. mlflow start-up)", f"{time.perf_counter() - t:.2f}", f"{len(df)} trials"]]
    warm = time_calls(lambda: load_runs(uri, STUDY), args.repeats)
    rows.append(["load_runs (warm)", ", ".join(f"{s:.2f}" for s in warm), ""])
    for plots in (False, True):
        for fmt in FORMATS:
            out = {}

            def write(fmt=fmt, plots=plots, out=out):
                out["text"], out["path"] = write_report(
                    uri, study=STUDY, fmt=fmt, reports_dir=root / "reports", plots=plots
                )

            ts = time_calls(write, args.repeats)
            rows.append(
                [
                    f"write_report fmt={fmt} plots={plots}",
                    ", ".join(f"{s:.2f}" for s in ts),
                    f"{out['path']} ({len(out['text'])} chars)",
                ]
            )
    rep.note("")
    rep.table(["what", "seconds", "result"], rows, name="times")
    rep.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
