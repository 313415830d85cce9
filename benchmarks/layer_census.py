"""Per-layer gradient census of a finished study as markdown tables: one row per layer, one column per
study row (docs/results/ssd512_census.md). ``lsbench report --telemetry`` averages over layers; the report's
heatmaps show one trial each; this puts every row's per-layer rates side by side.

    python benchmarks/layer_census.py studies/ssd512_census.yaml [--runs-dir runs] [--rate flush_rate]
        [--steps FIRST LAST]

Reads each trial's ``<runs-dir>/<study>/trials/<trial id>/layers_history.csv`` (what the trial's
telemetry wrote on every logged step) and prints, per layer, the mean over the logged steps (and seeds)
of the chosen rate, in percent (steps where the layer's activation gradient had no non-zero element
are left out of the activation rates: "–" where no step had one): ``flush_rate`` (non-zero gradient elements the row's format flushes
to zero), ``underflow_rate`` (below the format's normal range: subnormal or flushed),
``saturate_rate``, ``param_flush_rate``, ``param_saturate_rate``. ``--steps`` keeps the logged steps
in a range (to compare the first steps with the last ones). Layers in the order the CSV lists them
(the heads first, then the backbone from its last layer to its first: the order backward reaches them).
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, markdown_table, parser  # noqa: E402

RATES = ("flush_rate", "underflow_rate", "saturate_rate", "param_flush_rate", "param_saturate_rate")


def layer_rates(csv_path: Path, rate: str, steps: tuple[int, int] | None) -> dict[str, list[float]]:
    """``{layer: [rate per logged step]}`` from one trial's layers_history.csv (empty or NaN cells left out)."""
    out: dict[str, list[float]] = defaultdict(list)
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(row["step"])
            if steps and not steps[0] <= step <= steps[1]:
                continue
            cell = row.get(rate, "")
            # a step whose gradient had no non-zero element has no rate (the telemetry writes 0 there)
            if cell in ("", None) or (not rate.startswith("param_") and float(row.get("nonzero") or 0) == 0):
                continue
            v = float(cell)
            if not math.isnan(v):
                out[row["layer"]].append(v)
    return out


def census(study_path: str, runs_dir: Path, rate: str, steps) -> tuple[list[str], list[str], dict]:
    """(layers in order, row labels in study order, {(layer, label): mean over steps and seeds})."""
    from lossscale_bench.study.load import load_study

    study = load_study(study_path)
    labels: list[str] = []
    per: dict[tuple[str, str], list[float]] = defaultdict(list)
    orders: list[list[str]] = []  # each trial's layers in its CSV's order
    for cfg in study.trials():
        path = runs_dir / study.name / "trials" / cfg.trial_id / "layers_history.csv"
        if not path.is_file():
            continue
        if cfg.label not in labels:
            labels.append(cfg.label)
        rates = layer_rates(path, rate, steps)
        orders.append(list(rates))
        for layer, vals in rates.items():
            per[(layer, cfg.label)].append(statistics.fmean(vals))
    # the order of the trial that saw the most layers, then any layer only others saw
    layers = max(orders, key=len, default=[])
    layers += [lay for order in orders for lay in order if lay not in layers]
    return layers, labels, {k: statistics.fmean(v) for k, v in per.items() if v}


def table(layers, labels, means) -> str:
    """Layers down, rows across: each rate in percent, "–" where a row has no value for the layer."""
    return markdown_table(
        ["layer", *labels],
        [
            [layer] + [f"{100 * means[(layer, lab)]:.2f}" if (layer, lab) in means else None for lab in labels]
            for layer in layers
        ],
    )


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("study")
    ap.add_argument("--runs-dir", type=Path, default=Path("runs"))
    ap.add_argument("--rate", choices=RATES, default="flush_rate")
    ap.add_argument("--steps", type=int, nargs=2, metavar=("FIRST", "LAST"))
    ap.add_argument(
        "--extra",
        nargs="*",
        default=[],
        metavar="LABEL=CSV",
        help="more columns from other trials' layers_history.csv (another machine's run, say)",
    )
    a = ap.parse_args(argv)
    steps = tuple(a.steps) if a.steps else None
    layers, labels, means = census(a.study, a.runs_dir, a.rate, steps)
    for item in a.extra:
        label, _, path = item.partition("=")
        if not path or not Path(path).is_file():
            ap.error(f"--extra {item!r}: expected LABEL=path/to/layers_history.csv (an existing file)")
        labels.append(label)
        for layer, vals in layer_rates(Path(path), a.rate, steps).items():
            layers += [] if layer in layers else [layer]
            means[(layer, label)] = statistics.fmean(vals)
    if not labels:
        print(f"layer_census: no trial of {a.study} has a layers_history.csv under {a.runs_dir}", file=sys.stderr)
        return 2
    span = f"steps {a.steps[0]}-{a.steps[1]}" if a.steps else "every logged step"
    rep = Report.from_args(a)
    rep.table(
        ["layer", *labels],
        [
            [layer] + [f"{100 * means[(layer, lab)]:.2f}" if (layer, lab) in means else None for lab in labels]
            for layer in layers
        ],
        name=a.rate,
    )
    rep.note(f"\n{a.rate} in percent, mean over {span} and the seeds of each row.")
    rep.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
