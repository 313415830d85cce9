"""Two studies' shared rows side by side: each row's verdict against its own study's FP32 and its final
training loss against that FP32's (written for the default study on the kangaroo photos against the same rows
on the synthetic shapes; docs/results/kangaroo_e4m3.md, "Against the synthetic shapes, row by row"). Not a test.

Each side is a runs folder, a study name and a loss window in steps. The verdicts are `lsbench report`'s
"vs baseline" cells (paired Δ with its 95 % interval, and the word), the loss is `eval_curve.py --metric
loss --window N --raw`'s last window, mean over the row's seeds; rows are matched by their labels, in the
second study's order.

    python benchmarks/side_by_side.py runs kangaroo_e4m3 150 <clone>/runs smoke 50 --names photos shapes
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, Report, markdown_table, parser  # noqa: E402

VERDICT = re.compile(
    r"(?P<word>worse|better|equivalent|inconclusive)[^(]*\((?:paired|Welch)?,? ?p=[^)]*\), "
    r"Δ (?P<d>[-+][\d.]+) \[(?P<lo>[-+][\d.]+), (?P<hi>[-+][\d.]+)\]"
)


def md_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row in ``text`` (separator rows left out)."""
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|") and not set(line.strip()) <= set("|-: ")
    ]


def verdict(cell: str) -> str:
    """``Δ [lo, hi], word`` from a report's "vs baseline" cell; the cell as it is when it has no interval."""
    m = VERDICT.search(cell)
    return f"{m['d']} [{m['lo']}, {m['hi']}], {m['word']}" if m else cell


def report_verdicts(runs: str, study: str) -> dict[str, str]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lossscale_bench.cli",
            "report",
            "--runs-dir",
            runs,
            "--study",
            study,
            "--format",
            "markdown",
            "--out",
            "-",
            "--no-plots",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    rows = md_rows(out)
    head = rows[0]
    label, vs = head.index("Loss scale"), head.index("vs baseline")
    return {r[label].rstrip(" †"): verdict(r[vs]) for r in rows[1:] if len(r) == len(head)}


def final_losses(runs: str, study: str, window: int) -> tuple[dict[str, float], str]:
    """Each row's mean training loss in the last window of ``window`` steps, and that window's step."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "eval_curve.py"),
            runs,
            "--study",
            study,
            "--by-row",
            "--metric",
            "loss",
            "--window",
            str(window),
            "--raw",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    rows = md_rows(out)
    head, last = rows[0], rows[-1]
    return {h: float(v) for h, v in zip(head[1:], last[1:]) if v and not h.startswith("mean")}, last[0]


def table(sides: list[tuple[str, dict[str, str], dict[str, float], str]], baseline: str = "FP32 baseline") -> str:
    """The markdown table: rows present in every side, in the last side's order."""
    return markdown_table(*table_rows(sides, baseline))


def table_rows(
    sides: list[tuple[str, dict[str, str], dict[str, float], str]], baseline: str = "FP32 baseline"
) -> tuple[list[str], list[list[str]]]:
    """The header and rows of :func:`table`."""
    names = [s[0] for s in sides]
    head = (
        ["row"]
        + [f"{n}: Δ mAP vs FP32 [95 %], verdict" for n in names]
        + [f"{n}: training loss, last window (step {s[3]}), vs FP32" for n, s in zip(names, sides)]
    )
    rows = []
    for label in sides[-1][1]:
        if not all(label in s[1] and label in s[2] for s in sides):
            continue
        cells = [s[1][label] for s in sides]
        cells += [f"{s[2][label]:.3f} ({s[2][label] / s[2][baseline] - 1:+.1%})" for s in sides]
        rows.append([label, *cells])
    return head, rows


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument(
        "sides",
        nargs=6,
        metavar="RUNS STUDY WINDOW",
        help="two sides, each a runs folder, a study name and a loss window in steps",
    )
    ap.add_argument("--names", nargs=2, default=["first", "second"])
    args = ap.parse_args()
    sides = []
    for name, (runs, study, window) in zip(args.names, (args.sides[:3], args.sides[3:])):
        losses, step = final_losses(runs, study, int(window))
        sides.append((name, report_verdicts(runs, study), losses, step))
    rep = Report.from_args(args)
    rep.table(*table_rows(sides), name="rows")
    rep.finish()


if __name__ == "__main__":
    main()
