"""Concurrent trials logging every step through the real funnel: count what reaches MLflow.

N Ray Tune trials each log ``loss``/``loss_scale``/``lr`` for every step, as fast
as they can, for S seconds, through ``TuneSink`` -> ``tune.report`` -> the
driver's ``MlflowFunnel`` -> SQLite. At the end, every point each trial says it
logged must be in the store, and no "database is locked" may have failed a write.

    .venv/bin/python benchmarks/concurrent_logging.py --trials 8 --seconds 300

The CI test (tests/orchestration/test_concurrency.py) runs the same code for a shorter time.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser  # noqa: E402

KEYS = ("loss", "loss_scale", "lr")


def _logging_trial(config):
    from lossscale_bench.orchestration.tune_sink import TuneSink

    spec = config["trial"]
    sink = TuneSink()
    step = 0
    end = time.time() + spec["seconds"]
    while time.time() < end:
        step += 1
        sink.metrics([(k, float(step), step) for k in KEYS])
        if step % 10 == 0:
            sink.flush()
            time.sleep(0.005)
    sink.flush(outcome={"trial_id": spec["cfg"]["trial_id"], "status": "finished", "steps": step})


def run(trials: int = 8, seconds: float = 20.0, workdir: str | None = None) -> dict:
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    import ray
    from ray import tune

    from lossscale_bench.orchestration.funnel import MlflowFunnel
    from lossscale_bench.orchestration.outcomes import StudyResult
    from lossscale_bench.orchestration.progress import Progress
    from lossscale_bench.tracking import Tracker, default_tracking_uri

    work = Path(workdir or tempfile.mkdtemp(prefix="lsbench-conc-"))
    uri = default_tracking_uri(work)
    tracker = Tracker(uri, artifact_root=work / "artifacts")
    exp_id, parent = tracker.study_run("concurrency")
    run_ids, labels, iters = {}, {}, {}
    for i in range(trials):
        tid = f"t{i}"
        run = tracker.client.create_run(
            exp_id, tags={"mlflow.parentRunId": parent, "lsbench.role": "trial", "lsbench.trial_id": tid}
        )
        run_ids[tid], labels[tid], iters[tid] = run.info.run_id, tid, 10**9
    result = StudyResult(study="concurrency", tracking_uri=uri)
    progress = Progress(trials, 0, trials, quiet=True)
    funnel = MlflowFunnel(tracker, run_ids, labels, result, progress, iters)
    ray.init(address="local", num_cpus=trials, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    t0 = time.time()
    try:
        specs = [{"cfg": {"trial_id": f"t{i}"}, "seconds": seconds} for i in range(trials)]
        tune.Tuner(
            tune.with_resources(_logging_trial, {"CPU": 1}),
            param_space={"trial": tune.grid_search(specs)},
            tune_config=tune.TuneConfig(max_concurrent_trials=trials),
            run_config=tune.RunConfig(storage_path=str(work / "ray"), callbacks=[funnel], verbose=0),
        ).fit()
    finally:
        ray.shutdown()
    wall = time.time() - t0
    expected, stored = 0, 0
    for tid, run_id in run_ids.items():
        steps = result.outcomes[tid]["steps"]
        expected += steps * len(KEYS)
        for k in KEYS:
            stored += len(tracker.client.get_metric_history(run_id, k))
    return {
        "trials": trials,
        "seconds": seconds,
        "wall_s": round(wall, 1),
        "expected_points": expected,
        "stored_points": stored,
        "points_per_s": round(stored / wall, 1),
        "statuses": sorted({o["status"] for o in result.outcomes.values()}),
    }


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=300)
    args = ap.parse_args()
    out = run(args.trials, args.seconds)
    rep = Report.from_args(args)
    rep.data.update(out)
    rep.table(list(out), [[", ".join(v) if isinstance(v, list) else v for v in out.values()]], name="run")
    rep.finish()
    return 0 if out["expected_points"] == out["stored_points"] else 1


if __name__ == "__main__":
    sys.exit(main())
