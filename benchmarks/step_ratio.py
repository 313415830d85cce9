"""Each row's cost per image against the first row's, with the rows' iterations interleaved in one process.

Why: ``trial_cost.py`` times each row in a process of its own, one after another, so a
row's ratio carries whatever the machine did between the two processes: on this 2-vCPU VM one run's
ratio moved by about ±0.07, and two trees' identical FP32 rows once came out 12 % apart
(docs/records/index.md). Targets like "≤ 1.3× FP32" cannot be decided that way. Here every row is built
with the trial's own parts (:func:`lossscale_bench.trial.setup.build_parts` and
:func:`lossscale_bench.trial.runner._trainer`: its data, precision, scaler and telemetry hooks, exactly
as ``trial_cost.py`` builds them) in one process, and one iteration of each row runs in turn (the batch
fetch, every hook and the training step, as ``Trainer.run`` does), the rows' order rotating every round.
Drift and background load then hit every row alike, and each ratio comes with a 95 % interval: a
percentile bootstrap over rounds (seeded) of the ratio of mean iteration times.

What it does not time: process start, build, the first ``--warmup`` iterations (first calls, compiles),
evaluation and MLflow writes (``trial_cost.py`` does). The rows share the process's caches, which each
pays about alike.

    .venv/bin/python benchmarks/step_ratio.py --study studies/methods_fp4.yaml --rows 0 1 7 11
    .venv/bin/python benchmarks/step_ratio.py --rows 0 1 4 5 6 7 8     # the default study's rows
    .venv/bin/python benchmarks/step_ratio.py --rows 0 4 5 6 --precision fp32   # the per-layer machinery alone

Prints a markdown table for docs/records/index.md, with the CPU model and its vector extensions, and what the
study's logged steps (every ``log_every``-th: the telemetry census, the metrics) cost over the others.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, Report, cpu_description, order, parser, ratio_interval  # noqa: E402

__all__ = ["build", "logging_cost", "one_iteration", "ratio_interval"]


def build(study: str, row: int, seed: int, threads: int, precision: str | None = None):
    """A trial's trainer for one row of ``study`` (seed ``seed``), its evaluation switched off; ``precision``
    in place of the row's own (fp32: what a scaler's machinery costs without any rounding)."""
    from lossscale_bench.data.dali import make_batches
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.study import load_study
    from lossscale_bench.trial import runner, setup

    cfg = [t for t in load_study(study).trials() if t.seed == seed][row]
    d = cfg.to_dict()
    d["schedule"] = {**d["schedule"], "iterations": 10**9}
    d["eval"] = {**d["eval"], "every": None}
    if precision is not None:
        d["precision"] = precision
        d["label"] = f"{d['label']} [{precision}]"
    cfg = runner._as_config(d)
    sink = MemorySink()
    tmp = Path(tempfile.mkdtemp())
    parts = setup.build_parts(cfg, sink, tmp, threads)
    trainer = runner._trainer(cfg, parts, sink, tmp, tmp / "ck.pt", 10**9, 0, None)
    trainer.batches = iter(make_batches(cfg, parts.train_ds, 0))
    for h in trainer.hooks:
        h.before_train(trainer)
    return cfg.label, cfg.batch_size, trainer, cfg.log_every


def one_iteration(trainer) -> float:
    """Seconds for one iteration as ``Trainer.run`` runs it: the next batch, the hooks, the step (its loop
    body, copied rather than called, so that the script times commits from before it too)."""
    t0 = time.perf_counter()
    _, images, targets = next(trainer.batches)
    for h in trainer.hooks:
        h.before_step(trainer, trainer.state.step + 1)
    record = trainer.train_step(images, targets)
    for h in trainer.hooks:
        h.after_step(trainer, record)
    return time.perf_counter() - t0


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--study", default=str(ROOT / "studies" / "smoke.yaml"))
    ap.add_argument("--rows", type=int, nargs="+", default=[0, 1], help="row indices; the first is the reference")
    ap.add_argument("--iterations", type=int, default=150, help="timed iterations per row")
    ap.add_argument("--warmup", type=int, default=10, help="untimed iterations per row first")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a study trial runs with 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--precision",
        help="every row in this precision instead of its own (fp32: the scalers' machinery alone, no rounding)",
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    rows = [build(args.study, r, args.seed, args.threads, args.precision) for r in args.rows]
    times: list[list[float]] = [[] for _ in rows]
    logged: list[list[bool]] = [[] for _ in rows]  # the step logs (telemetry census, metrics): step % log_every == 0
    for rnd in range(args.warmup + args.iterations):
        for i in order(range(len(rows)), rnd, "rotate"):
            step = rows[i][2].state.step + 1
            dt = one_iteration(rows[i][2])
            if rnd >= args.warmup:
                times[i].append(dt)
                logged[i].append(step % rows[i][3] == 0)
    base = times[0]
    rep = Report.from_args(args)
    rep.note(
        f"{cpu_description()}; torch threads {args.threads}; {args.study}, seed {args.seed}; "
        f"{args.iterations} timed iterations per row after {args.warmup}, interleaved; "
        f"{time.perf_counter() - t_start:.0f} s in all\n"
    )
    table = []
    for (label, batch, _, log_every), t, lg in zip(rows, times, logged):
        r, lo, hi = ratio_interval([a / batch for a in t], [b / rows[0][1] for b in base])
        table.append(
            [
                label,
                f"{1000 * statistics.fmean(t):.1f}",
                f"{1000 * statistics.median(t):.1f}",
                f"{r:.3f}× [{lo:.3f}, {hi:.3f}]",
                *logging_cost(t, lg, log_every).split(" | "),
            ]
        )
    rep.table(
        [
            "row",
            "iteration mean (ms)",
            "iteration median (ms)",
            "per image vs first row [95 % interval]",
            "logged / other steps (ms)",
            "logging, share of the mean step",
        ],
        table,
        name="rows",
    )
    rep.finish()


def logging_cost(times: list[float], logged: list[bool], log_every: int) -> str:
    """``logged / other (ms) | share``: what a logged step costs over the others, spread over ``log_every``
    steps, as a share of the mean step (the target: telemetry at the study's ``log_every`` <= 5 % of a step)."""
    on = [t for t, flag in zip(times, logged) if flag]
    off = [t for t, flag in zip(times, logged) if not flag]
    if not on or not off:
        return "– | –"
    extra = (statistics.fmean(on) - statistics.fmean(off)) / log_every
    return (
        f"{1000 * statistics.fmean(on):.1f} / {1000 * statistics.fmean(off):.1f} | "
        f"{100 * extra / statistics.fmean(times):.1f} %"
    )


if __name__ == "__main__":
    main()
