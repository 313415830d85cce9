"""Error rates and seeds used when seeds are added until a comparison is decided, by simulation.

Why: a study with ``seeds: {start, step, max, until: decided}`` looks at each comparison after every
round of seeds (lossscale_bench.report.sequential).  This table is the evidence that its verdicts keep
the report's stated rates (a false "better"/"worse" at no difference, a false "equivalent" at a
difference of exactly the margin: 5 % each) and what it costs in seeds, beside the naive rule that
looks with a plain t-test and TOST after every round.  Paired differences are drawn N(Δ, sd²) in mAP
points at the paired spreads measured in this project (0.9 to 2.6); margin 1.0.

    .venv/bin/python benchmarks/sequential_rates.py                       # 3, 6, ..., 18 seeds, 10,000 each
    .venv/bin/python benchmarks/sequential_rates.py --reps 1000000 --sd 1 --delta 0
    .venv/bin/python benchmarks/sequential_rates.py --start 3 --step 1 --max 10 --spending pocock

Prints a markdown table: per spread and true difference, the share of comparisons called different
(better + worse), equivalent, and neither at the last look, and the mean seeds used, for the
group-sequential rule and the naive one.  Rows at Δ = 0 (false difference) and |Δ| = margin (false
equivalence) are the error rates; the Monte-Carlo standard error of a 5 % rate is given below.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser  # noqa: E402

from lossscale_bench.report.sequential import SPENDING, look_sizes  # noqa: E402
from lossscale_bench.report.sequential_sim import simulate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--start", type=int, default=3)
    ap.add_argument("--step", type=int, default=3)
    ap.add_argument("--max", type=int, default=18)
    ap.add_argument("--margin", type=float, default=1.0)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--spending", choices=SPENDING, default="obf")
    ap.add_argument("--reps", type=int, default=10_000)
    ap.add_argument("--sd", type=float, nargs="+", default=[0.9, 1.7, 2.6])
    ap.add_argument("--delta", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0, 5.0, -1.0])
    args = ap.parse_args(argv)

    sizes = look_sizes(args.start, args.step, args.max)
    began = time.perf_counter()
    rep = Report.from_args(args)
    rep.note(
        f"looks at {', '.join(map(str, sizes))} seeds; margin ±{args.margin:g}; alpha {args.alpha:g}; "
        f"{args.spending} spending; {args.reps} comparisons per row\n"
    )
    rows = []
    for sd in args.sd:
        for k, delta in enumerate(args.delta):
            seed = 1000 * k + round(100 * sd)
            kw = {
                "sizes": sizes,
                "maximum": args.max,
                "margin": args.margin,
                "reps": args.reps,
                "seed": seed,
                "alpha": args.alpha,
                "spending": args.spending,
            }
            r, n = simulate(delta, sd, **kw), simulate(delta, sd, naive=True, **kw)
            rows.append(
                [
                    f"{sd:g}",
                    f"{delta:+g}",
                    f"{r['different']:.4f}",
                    f"{r['equivalent']:.4f}",
                    f"{r['undecided']:.4f}",
                    f"{r['seeds']:.1f}",
                    f"{n['different']:.4f}",
                    f"{n['equivalent']:.4f}",
                    f"{n['seeds']:.1f}",
                ]
            )
    rep.table(
        [
            "paired sd",
            "Δ",
            "different",
            "equivalent",
            "neither at max",
            "mean seeds",
            "naive: different",
            "naive: equivalent",
            "naive: mean seeds",
        ],
        rows,
        name="rates",
    )
    se = math.sqrt(args.alpha * (1 - args.alpha) / args.reps)
    rep.note(
        f"\nMonte-Carlo standard error of a {args.alpha:g} rate over {args.reps} comparisons: {se:.4f}; "
        f"{time.perf_counter() - began:.1f} s"
    )
    rep.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
