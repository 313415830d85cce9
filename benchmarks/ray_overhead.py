"""Ray's cost per trial: the same micro study through Ray Tune and in-process, side by side.

Both run the K trials one at a time. Each trains ssd_tiny for 2 iterations on a tiny synthetic set and
evaluates once, so the training itself is small and the difference between the
two executors is Ray's start-up plus its per-trial scheduling and worker start.

    .venv/bin/python benchmarks/ray_overhead.py --trials 8
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser  # noqa: E402

STUDY = """\
name: overhead
dataset: {{name: synthetic, train_images: 16, val_images: 4, image_size: 64, seed: 0}}
model: ssd_tiny
model_options: {{width: 8}}
batch_size: 4
precision: fp32
scaling: [{{method: none}}]
seeds: {seeds}
schedule: {{iterations: 2, lr: 0.01}}
log_every: 1
"""


def timed(executor: str, trials: int, num_cpus: int) -> float:
    from lossscale_bench.orchestration.study_runner import run_study
    from lossscale_bench.study import load_study_text

    study = load_study_text(STUDY.format(seeds=list(range(trials))))
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        res = run_study(
            study, runs_dir=Path(d) / "runs", executor=executor, num_cpus=num_cpus, quiet=True, max_concurrent=1
        )  # one at a time, like the in-process executor
        dt = time.perf_counter() - t0
    assert res.counts()["finished"] == trials, res.counts()
    return dt


def ray_startup(num_cpus: int) -> float:
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    dt = time.perf_counter() - t0
    ray.shutdown()
    return dt


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()
    from lossscale_bench.data.synthetic import ensure_synthetic

    ensure_synthetic(train_images=16, val_images=4, image_size=64, seed=0)  # not part of either timing
    local = timed("local", args.trials, args.num_cpus)
    ray_t = timed("ray", args.trials, args.num_cpus)
    start = ray_startup(args.num_cpus)
    rep = Report.from_args(args)
    rep.note(f"{args.trials} trials, num_cpus {args.num_cpus}")
    rep.table(
        ["executor", "wall (s)", "per trial (s)"],
        [
            ["in-process (`--executor local`)", f"{local:.1f}", f"{local / args.trials:.2f}"],
            ["Ray Tune", f"{ray_t:.1f}", f"{ray_t / args.trials:.2f}"],
        ],
        name="executors",
    )
    rep.note(
        f"\nray.init alone: {start:.1f} s; Ray's extra cost per trial after start-up, "
        f"(trials one at a time): {(ray_t - start - local) / args.trials:.2f} s "
        f"(ratio Ray/in-process {ray_t / local:.2f})"
    )
    rep.finish()


if __name__ == "__main__":
    main()
