"""What a trial costs as ``lsbench run`` runs it, row by row, against FP32.

``precision_overhead.py`` times a bare step (no telemetry, no scaler). A study trial pays more:
a worker process that imports torch and the package, the data set read from its cache, the
first call of every compiled kernel, steps with the study's telemetry (a census on every
``log_every``-th step) and the row's own scaler, the final evaluation, and the MLflow writes of
everything the trial reported. This script runs each row of a study (seed 0) through the
trial's own code (:func:`lossscale_bench.trial.setup.build_parts`,
:func:`lossscale_bench.trial.runner._trainer`: the same hooks, telemetry and scaler as a real
trial) in a fresh process per row, and times those parts separately:

* ``start``: process start to the package imported (what a fresh Ray worker pays; with
  ``reuse_actors`` a worker pays it once per study, see ``--warm``);
* ``build``: data, model, precision, scaler, telemetry (data from the on-disk cache);
* ``first``: the first training step (compiles the rounding kernels, from Inductor's cache
  after the first process);
* ``step``: the median training step over all later steps, logged steps included in the mean
  (``step mean``), so the telemetry's cost is in it as the study pays it; ``logged``: the median
  of the logged steps alone;
* ``eval``: the final evaluation on the study's validation set;
* ``mlflow``: writing the trial's metrics and tags to a fresh SQLite store through the
  project's ``Tracker`` (in a study the driver does it, on the other core).

Per-image cost relative to FP32 is ``step mean`` over FP32's. Rows run one after another,
repeated ``--repeats`` times in rotation (row order shifted each repeat) so that machine load
hits every row alike; the table gives medians over repeats.

    .venv/bin/python benchmarks/trial_cost.py --iterations 100 --repeats 2
    git worktree add /tmp/before HEAD~1 && .venv/bin/python benchmarks/trial_cost.py --trees /tmp/before .
    .venv/bin/python benchmarks/trial_cost.py --study studies/methods_e4m3.yaml --rows 0 2 6

Prints a markdown table for docs/records/index.md, with the CPU model and its vector extensions.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, Report, child_json, cpu_description, order, parser  # noqa: E402

CHILD = r"""
import json, sys, time, tempfile, statistics
t_imported0 = time.time()
import torch
from pathlib import Path
from lossscale_bench.study import load_study
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.trial import setup, runner
from lossscale_bench.data.dali import make_batches
t_imported = time.time()
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
study = load_study(args["study"])
cfg = [t for t in study.trials() if t.seed == args["seed"]][args["row"]]
d = cfg.to_dict()
d["schedule"] = {**d["schedule"], "iterations": args["iterations"]}
d["eval"] = {**d["eval"], "every": None}
cfg = runner._as_config(d)
sink = MemorySink()
tmp = Path(tempfile.mkdtemp())
t0 = time.perf_counter()
parts = setup.build_parts(cfg, sink, tmp, args["threads"])
trainer = runner._trainer(cfg, parts, sink, tmp, tmp / "ck.pt", 10 ** 9, 0, None)
trainer.batches = iter(make_batches(cfg, parts.train_ds, 0))
t_build = time.perf_counter() - t0
# A hook that notes the time at the start of every iteration (after its batch is loaded), so
# consecutive notes bracket one whole iteration as Trainer.run runs it: the train step, every hook
# and the next batch's loading. Works with any commit's Trainer (run() is the same).
class Clock:
    def __init__(self):
        self.t = []
    def before_train(self, trainer): pass
    def before_step(self, trainer, step): self.t.append(time.perf_counter())
    def after_step(self, trainer, record): pass
    def after_train(self, trainer): self.t.append(time.perf_counter())
    def state_dict(self): return {}
    def load_state_dict(self, state): pass
clock = Clock()
trainer.hooks.insert(0, clock)
trainer.run()
times = [b - a for a, b in zip(clock.t, clock.t[1:])]
logged = [(k + 1) % cfg.log_every == 0 for k in range(len(times))]
t0 = time.perf_counter()
parts.evaluate()
t_eval = time.perf_counter() - t0
from lossscale_bench.tracking.tracker import Tracker
t0 = time.perf_counter()
tracker = Tracker("sqlite:///" + str(tmp / "mlflow.db"), artifact_root=tmp / "artifacts")
exp = tracker.experiment_id("bench")
parent, _ = tracker.study_run("bench")
run_id = tracker.ensure_trial_run(exp, parent, cfg)
t_open = time.perf_counter() - t0
t0 = time.perf_counter()
tracker.log_metrics(run_id, sink.items)
tracker.set_tags(run_id, sink.tag_values)
t_mlflow = time.perf_counter() - t0
later = times[1:]
print(json.dumps({"start": t_imported - args["t_spawn"], "imports": t_imported - t_imported0, "build": t_build,
                  "first": times[0], "step": statistics.median(later), "step_mean": statistics.fmean(later),
                  "logged": statistics.median([t for t, l in zip(later, logged[1:]) if l] or [float("nan")]),
                  "eval": t_eval, "mlflow": t_mlflow, "mlflow_open": t_open,
                  "batch": cfg.batch_size, "label": cfg.label}))
"""


def run_row(study: str, row: int, iterations: int, threads: int, seed: int, tree: Path = ROOT) -> dict:
    """One row in a fresh process whose working directory is ``tree`` (a checkout: its package is
    the one imported, so two commits can be timed side by side)."""
    args = {
        "study": study,
        "row": row,
        "iterations": iterations,
        "threads": threads,
        "seed": seed,
        "t_spawn": time.time(),
    }
    return child_json(["-c", CHILD, json.dumps(args)], cwd=tree, what=f"row {row}")


def main() -> None:
    ap = parser(__doc__, repeats=2)
    ap.add_argument("--study", default=str(ROOT / "studies" / "smoke.yaml"))
    ap.add_argument("--rows", type=int, nargs="*", help="row indices (default: every row)")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a demo trial runs with 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--trees",
        nargs="+",
        type=Path,
        default=[ROOT],
        help="checkouts to time side by side, each row alternating between them, their order "
        "reversed every other repeat (e.g. a `git worktree` of the previous commit, then this "
        "one); ratios are to the first tree's first row",
    )
    args = ap.parse_args()
    from lossscale_bench.study import load_study

    study = load_study(args.study)
    n_rows = len([t for t in study.trials() if t.seed == args.seed])
    rows = args.rows if args.rows else list(range(n_rows))
    keys = [(t, r) for r in rows for t in range(len(args.trees))]
    results: dict[tuple[int, int], list[dict]] = {k: [] for k in keys}
    t_all = time.perf_counter()
    for rnd in range(args.repeats):
        # rows rotated, and the trees' order within a row reversed every other repeat: the tree timed first
        # in a pair came out faster in both orders on the 2-core machine (docs/records/index.md), so with
        # several trees use an even number of repeats
        for r in order(rows, rnd, "rotate"):
            for t in order(range(len(args.trees)), rnd, "abba"):
                results[t, r].append(run_row(args.study, r, args.iterations, args.threads, args.seed, args.trees[t]))
                print(
                    f"  repeat {rnd + 1}, {args.trees[t]}, row {r}: {results[t, r][-1]['label']}",
                    file=sys.stderr,
                    flush=True,
                )
    med = {
        k: {f: statistics.median(x[f] for x in v) for f in v[0] if isinstance(v[0][f], float)}
        for k, v in results.items()
    }
    base = med[keys[0]]["step_mean"]
    rep = Report.from_args(args)
    rep.note(
        f"{cpu_description()}; torch threads {args.threads}; {args.iterations} iterations per row, "
        f"median of {args.repeats} repeats; {time.perf_counter() - t_all:.0f} s in all\n"
    )
    table = []
    for t, r in keys:
        m, label = med[t, r], results[t, r][0]["label"]
        table.append(
            [
                args.trees[t].resolve().name,
                label,
                f"{m['start']:.1f}",
                f"{m['build']:.1f}",
                f"{m['first']:.1f}",
                f"{m['step'] * 1000:.1f}",
                f"{m['logged'] * 1000:.1f}",
                f"{m['step_mean'] * 1000:.1f}",
                f"{m['step_mean'] / base:.2f}×",
                f"{m['eval']:.1f}",
                f"{m['mlflow']:.2f}",
            ]
        )
    rep.table(
        [
            "tree",
            "row",
            "start (s)",
            "build (s)",
            "first step (s)",
            "step median (ms)",
            "logged step (ms)",
            "step mean (ms)",
            "per image vs first row",
            "eval (s)",
            "MLflow writes (s)",
        ],
        table,
        name="rows",
    )
    rep.finish()


if __name__ == "__main__":
    main()
