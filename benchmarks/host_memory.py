"""What glibc's malloc defaults cost a CPU trial: each row's step with and without
:func:`lossscale_bench.backends.host_memory.keep_freed_memory`, in alternating child processes.

Why a process each: the malloc settings are process-wide and cannot be undone, so the two arms cannot
share a process as ``step_ratio.py``'s rows do. Each round starts one child per arm (``LSBENCH_MALLOC=system``:
glibc's defaults; unset: the trial's setting), in alternating order, and every child builds the row with the
trial's own parts (``step_ratio.build``), runs ``--warmup`` iterations, then times ``--iterations`` and reads
its own ``getrusage``: minor page faults and system time per iteration, and the peak resident size.
The ratio's 95 % interval is ``step_ratio.ratio_interval``'s, a percentile bootstrap over rounds.

    .venv/bin/python benchmarks/host_memory.py --rows 0 1 2 6 8 --rounds 3
    .venv/bin/python benchmarks/host_memory.py --study benchmarks/fp4_precisions.yaml --rows 0 5 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, Report, child_json, cpu_description, order, parser, ratio_interval  # noqa: E402

ARMS = ("system", "kept")


def child(study: str, row: int, warmup: int, iterations: int) -> dict:
    """One arm of one round, in this process: ms, faults and system ms per iteration, peak RSS."""
    import resource
    import time

    import torch
    from step_ratio import build, one_iteration

    from lossscale_bench.backends.host_memory import keep_freed_memory

    torch.set_num_threads(1)
    label, _, trainer, _ = build(study, row, 0, 1)
    for _ in range(warmup):
        one_iteration(trainer)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(iterations):
        one_iteration(trainer)
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    return {
        "label": label,
        "kept": keep_freed_memory(),
        "ms": 1000 * (t1 - t0) / iterations,
        "faults": (r1.ru_minflt - r0.ru_minflt) / iterations,
        "sys_ms": 1000 * (r1.ru_stime - r0.ru_stime) / iterations,
        "rss_mb": r1.ru_maxrss / 1024,
    }


def run_arm(arm: str, args, row: int) -> dict:
    env = dict(os.environ)
    env.pop("LSBENCH_MALLOC", None)
    if arm == "system":
        env["LSBENCH_MALLOC"] = "system"
    res = child_json(
        [
            __file__,
            "--child",
            "--study",
            args.study,
            "--rows",
            str(row),
            "--warmup",
            str(args.warmup),
            "--iterations",
            str(args.iterations),
        ],
        env=env,
        what=f"arm {arm}, row {row}",
    )
    if res["kept"] != (arm == "kept"):
        raise SystemExit(f"arm {arm}: the setting was {'in force' if res['kept'] else 'not in force'}")
    return res


def main() -> None:
    ap = parser(__doc__, repeats=3, repeats_flags=("--rounds",), repeats_help="rounds of one child per arm")
    ap.add_argument("--study", default=str(ROOT / "studies" / "smoke.yaml"))
    ap.add_argument("--rows", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.study, args.rows[0], args.warmup, args.iterations)))
        return

    results = {(row, arm): [] for row in args.rows for arm in ARMS}
    for rnd in range(args.repeats):
        for row in args.rows:
            for arm in order(ARMS, rnd, "abba"):
                results[(row, arm)].append(run_arm(arm, args, row))
    rep = Report.from_args(args)
    rep.note(
        f"{cpu_description()}; one torch thread; {args.study}; {args.repeats} rounds of one child process "
        f"per arm, {args.iterations} timed iterations each after {args.warmup}\n"
    )

    def mean(xs, key):
        return statistics.fmean(x[key] for x in xs)

    table = []
    for row in args.rows:
        s, k = results[(row, "system")], results[(row, "kept")]
        r, lo, hi = ratio_interval([x["ms"] for x in k], [x["ms"] for x in s])
        table.append(
            [
                s[0]["label"],
                f"{mean(s, 'ms'):.1f}",
                f"{mean(k, 'ms'):.1f}",
                f"{r:.3f} [{lo:.3f}, {hi:.3f}]",
                f"{mean(s, 'faults'):.0f} → {mean(k, 'faults'):.0f}",
                f"{mean(s, 'sys_ms'):.1f} → {mean(k, 'sys_ms'):.1f}",
                f"{mean(s, 'rss_mb'):.0f} → {mean(k, 'rss_mb'):.0f}",
            ]
        )
    rep.table(
        [
            "row",
            "step, glibc defaults (ms)",
            "step, freed memory kept (ms)",
            "kept / defaults [95 % interval]",
            "minor faults a step",
            "system time a step (ms)",
            "peak RSS (MB)",
        ],
        table,
        name="rows",
    )
    rep.data["results"] = [{"row": row, "arm": arm, "rounds": v} for (row, arm), v in results.items()]
    rep.finish()


if __name__ == "__main__":
    main()
