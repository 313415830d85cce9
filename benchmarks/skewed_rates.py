"""Error rates of the paired verdicts when the per-seed differences are not normal, with and without the checks.

Why: the paired t-test, TOST and the seed plan's group-sequential looks keep their stated 5 % (a false
"different" at no difference, a false "equivalent" at a difference of exactly the margin) only for
roughly normal per-seed differences.  The report checks the differences (Shapiro–Wilk, p < 0.05, from 3
seeds) and, where they look skewed, takes no decision at a plan's look and decides a table's row by
rank tests (Wilcoxon signed-rank, rank TOST): lossscale_bench.report.normality.  This table measures
what that does, on differences drawn normal, t₃ (heavy tails) and lognormal-shaped (usually close, now
and then much worse; lossscale_bench.report.sequential_sim.draw) at the project's paired spreads.

    .venv/bin/python benchmarks/skewed_rates.py                   # 3, 6, ..., 18 seeds, 4,000 comparisons a cell
    .venv/bin/python benchmarks/skewed_rates.py --reps 20000 --shape lognormal --sd 1.7

Columns: the plan's rule without and with the check (different, equivalent, mean seeds), the fixed-n
tables' t-test on the seeds the plan gathered (different: the optional-stopping effect), and the fixed-n
verdict at ``--fixed-n`` seeds without and with the check.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser  # noqa: E402

from lossscale_bench.report.sequential import look_sizes  # noqa: E402
from lossscale_bench.report.sequential_sim import SHAPES, simulate, simulate_fixed  # noqa: E402


def _row(shape: str, sd: float, delta: float, args, sizes, seed: int) -> list[str]:
    kw = {"margin": args.margin, "reps": args.reps, "seed": seed}
    plain = simulate(delta, sd, sizes=sizes, maximum=args.max, shape=shape, **kw)
    checked = simulate(delta, sd, sizes=sizes, maximum=args.max, shape=shape, check=True, **kw)
    fixed = simulate_fixed(delta, sd, args.fixed_n, shape=shape, **kw)
    fixed_c = simulate_fixed(delta, sd, args.fixed_n, shape=shape, check=True, **kw)
    return [
        shape,
        f"{sd:g}",
        f"{delta:g}",
        f"{plain['different']:.3f}",
        f"{plain['equivalent']:.3f}",
        f"{checked['different']:.3f}",
        f"{checked['equivalent']:.3f}",
        f"{plain['seeds']:.1f} / {checked['seeds']:.1f}",
        f"{plain['fixed_n_different']:.3f}",
        f"{fixed['different']:.3f}",
        f"{fixed['equivalent']:.3f}",
        f"{fixed_c['different']:.3f}",
        f"{fixed_c['equivalent']:.3f}",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--start", type=int, default=3)
    ap.add_argument("--step", type=int, default=3)
    ap.add_argument("--max", type=int, default=18)
    ap.add_argument("--fixed-n", type=int, default=6)
    ap.add_argument("--margin", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=4_000)
    ap.add_argument("--shape", choices=SHAPES, nargs="+", default=list(SHAPES))
    ap.add_argument("--sd", type=float, nargs="+", default=[0.9, 1.7, 2.6])
    ap.add_argument("--delta", type=float, nargs="+", default=[0.0, -1.0])
    args = ap.parse_args(argv)

    sizes = look_sizes(args.start, args.step, args.max)
    began = time.perf_counter()
    rep = Report.from_args(args)
    rep.note(
        f"plan: looks at {', '.join(map(str, sizes))} seeds, O'Brien-Fleming, alpha 0.05; fixed n = {args.fixed_n}; "
        f"margin ±{args.margin:g}; {args.reps} comparisons a cell; check: Shapiro-Wilk p < 0.05\n"
    )
    rows = []
    for i, shape in enumerate(args.shape):
        for sd in args.sd:
            for k, delta in enumerate(args.delta):
                rows.append(_row(shape, sd, delta, args, sizes, seed=10_000 * i + 1000 * k + round(100 * sd)))
    rep.table(
        [
            "shape",
            "paired sd",
            "Δ",
            "plan: different",
            "plan: equivalent",
            "plan + check: different",
            "plan + check: equivalent",
            "mean seeds (plan / + check)",
            "fixed-n test on the plan's seeds: different",
            f"fixed {args.fixed_n}: different",
            f"fixed {args.fixed_n}: equivalent",
            f"fixed {args.fixed_n} + check: different",
            f"fixed {args.fixed_n} + check: equivalent",
        ],
        rows,
        name="skewed_rates",
    )
    se = math.sqrt(0.05 * 0.95 / args.reps)
    rep.note(
        f"\nMonte-Carlo standard error of a 0.05 rate over {args.reps} comparisons: {se:.4f}; "
        f"{time.perf_counter() - began:.1f} s"
    )
    rep.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
