"""The docs home page's figure: the E4M3 rows of ``docs/results/methods_e4m3.md``, legible at page width.

    python tools/home_figure.py        # writes docs/results/img/home_methods_e4m3.png

Read from the report table that page includes (``docs/results/reports/methods_e4m3.md``, as
``lsbench report`` printed it): one horizontal bar per row, mean mAP with its sample std over the seeds,
labels left of the bars so that every one is readable at the page's ~700 px. Nothing is measured here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "results" / "reports" / "methods_e4m3.md"
OUT = ROOT / "docs" / "results" / "img" / "home_methods_e4m3.png"
CELL = re.compile(r"\*{0,2}(?P<mean>-?\d+\.\d+)\*{0,2} ± (?P<std>\d+\.\d+) \(n=(?P<n>\d+)\)")


def rows(text: str) -> list[tuple[str, float, float, int]]:
    """(label, mean, std, n) of each table row with a value, in the table's order."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not (m := CELL.search(cells[3])):
            continue
        out.append((cells[1].replace(" †", ""), float(m["mean"]), float(m["std"]), int(m["n"])))
    return out


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    data = rows(TABLE.read_text(encoding="utf-8"))
    if not data:
        print(f"no rows in {TABLE}", file=sys.stderr)
        return 1
    fig = Figure(figsize=(7.2, 0.34 * len(data) + 1.0), dpi=150, layout="constrained")
    ax = fig.add_subplot()
    labels, means, stds, ns = zip(*data)
    seeds = "/".join(str(n) for n in sorted(set(ns)))
    y = range(len(data))[::-1]
    colors = ["#555555" if "FP32" in label else "#3f51b5" for label in labels]
    ax.barh(list(y), means, xerr=stds, color=colors, error_kw={"elinewidth": 1, "capsize": 2})
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.set_xlabel(f"COCO mAP@[.5:.95], % (mean ± sample std over {seeds} seeds)", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title("E4M3 gradients, every method (ssd_tiny, synthetic shapes)", fontsize=9, loc="right")
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(OUT)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
