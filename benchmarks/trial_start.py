"""A trial's fixed cost: the time from a fresh process's start to its first training step's record.

Every trial of a study started in a fresh worker pays it before it trains: Python and torch
imported, the package imported, data, model and scaler built, the rounding kernels compiled (or
loaded from Inductor's on-disk cache), the first step run and reported. The driver then pays
matplotlib's first plot of the study (its font list, built on the first plot of a machine and kept
in ``MPLCONFIGDIR``). Each measurement here is one fresh process that runs
:func:`lossscale_bench.trial.runner.run_trial` on one study row (its first seed, a few iterations,
``log_every: 1``) into a ``MemorySink`` whose first ``metrics`` call notes the time, then draws the
trial's plots (:func:`lossscale_bench.report.plots.trial_plots`) from what the sink holds.

Columns (seconds, medians over repeats): ``import`` (process start to ``run_trial`` imported),
``first step`` (process start to the first step's record), ``plots`` (the trial's plots, the first
drawing of the process). ``--caches cold`` runs a measurement with empty Inductor and matplotlib
cache folders (a machine's first trial); ``warm`` (the default) with the machine's own, warm after the
first run; both: the two interleaved.

Two checkouts side by side (the process's working directory and ``PYTHONPATH`` are the tree's, so
its package is the one imported), alternating A B B A so that load on a shared machine hits both::

    git worktree add /tmp/before HEAD
    PYTHONPATH=. .venv/bin/python benchmarks/trial_start.py --trees /tmp/before . --repeats 6
    PYTHONPATH=. .venv/bin/python benchmarks/trial_start.py --trees /tmp/before . --repeats 3 --caches warm cold --no-native

On a GPU machine, a CUDA study's E4M3 row (its rounding kernels are compiled by Inductor there)::

    python3 benchmarks/trial_start.py --study studies/gpu_smoke.yaml --row 6 --caches warm cold --repeats 2
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, Report, child_json, cpu_description, order, parser  # noqa: E402

CHILD = r"""
import json, sys, time, tempfile
args = json.loads(sys.argv[1])
t_start = args["t_spawn"]
from lossscale_bench.trial.runner import run_trial
t_imported = time.time()
from pathlib import Path
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.study import load_study

class FirstRecord(MemorySink):
    first = None
    def metrics(self, items):
        if self.first is None and items:
            self.first = time.time()
        super().metrics(items)

study = load_study(args["study"])
trials = study.trials()
cfg = [t for t in trials if t.seed == trials[0].seed][args["row"]]
d = cfg.to_dict()
d["schedule"] = {**d["schedule"], "iterations": args["iterations"]}
d["eval"] = {**d["eval"], "every": None}
d["log_every"] = 1
sink = FirstRecord()
tmp = Path(tempfile.mkdtemp())
out = run_trial(d, sink=sink, trial_dir=tmp / "trial", threads=1)
assert out.status == "finished", out.error
from lossscale_bench.report.plots import trial_plots
hist = {}
for k, v, s in sink.items:
    hist.setdefault(k, []).append((s, v))
t0 = time.time()
written = trial_plots(hist, tmp / "trial" / "layers_history.csv", tmp / "plots")
t_plots = time.time() - t0
print(json.dumps({"import": t_imported - t_start, "first": sink.first - t_start, "plots": t_plots,
                  "n_plots": len(written)}))
"""


def measure(tree: Path, study: str, row: int, iterations: int, cold: bool, no_native: bool = False) -> dict:
    """One fresh process in ``tree``; with ``cold``, empty Inductor and matplotlib cache folders; with
    ``no_native``, the rounding kernels compiled by Inductor instead of the C kernels (the GPU's path)."""
    # the tree first; what PYTHONPATH already holds after it (a GPU machine's folder of extra packages)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p))
    if no_native:
        env["LSBENCH_NO_NATIVE"] = "1"
    with tempfile.TemporaryDirectory() as scratch:
        if cold:
            env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(scratch) / "inductor")
            env["MPLCONFIGDIR"] = str(Path(scratch) / "mpl")
        args = {"study": study, "row": row, "iterations": iterations, "t_spawn": time.time()}
        return child_json(["-c", CHILD, json.dumps(args)], env=env, cwd=tree, what=f"trial in {tree}")


def main() -> None:
    ap = parser(__doc__, repeats=4)
    ap.add_argument("--trees", nargs="+", type=Path, default=[ROOT], help="checkouts to compare (default: this one)")
    ap.add_argument("--study", default="lossscale_bench/studies/smoke.yaml")
    ap.add_argument("--row", type=int, default=1, help="row of the study (default 1: E4M3, no loss scale)")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument(
        "--caches",
        nargs="+",
        choices=("warm", "cold"),
        default=["warm"],
        help="warm: the machine's own caches; cold: empty Inductor and matplotlib caches in every run "
        "(both: the two settings interleaved)",
    )
    ap.add_argument(
        "--no-native",
        action="store_true",
        help="LSBENCH_NO_NATIVE=1: rounding kernels compiled by Inductor, as on a GPU",
    )
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    report = Report.from_args(args)
    kernels = "Inductor kernels (LSBENCH_NO_NATIVE=1)" if args.no_native else "default kernels"
    report.note(
        f"CPU: {cpu_description()}; row {args.row} of {args.study}, {args.iterations} iterations, "
        f"log_every 1, {kernels}, {args.repeats} repeats (A B B A)"
    )
    settings = [(t, c) for t in trees for c in args.caches]
    measure(trees[0], args.study, args.row, args.iterations, False, args.no_native)  # untimed: warms the caches
    got: dict[tuple, list[dict]] = {s: [] for s in settings}
    for rnd in range(args.repeats):
        for tree, cache in order(settings, rnd, "abba"):
            got[tree, cache].append(
                measure(tree, args.study, args.row, args.iterations, cache == "cold", args.no_native)
            )
    rows = []
    for tree, cache in settings:
        runs = got[tree, cache]
        med = {k: statistics.median(r[k] for r in runs) for k in ("import", "first", "plots")}
        rows.append(
            [
                str(tree),
                cache,
                f"{med['import']:.2f}",
                f"{med['first']:.2f}",
                f"{med['plots']:.2f}",
                " ".join(f"{r['first']:.1f}" for r in runs),
            ]
        )
    report.table(
        ["tree", "caches", "import (s)", "first step (s)", "plots (s)", "first step, each run"],
        rows,
        name="trial start",
    )
    report.finish()


if __name__ == "__main__":
    main()
