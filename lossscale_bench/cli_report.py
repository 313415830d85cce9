"""``lsbench report``: its arguments and what it does with them (the rest of ``lsbench`` is :mod:`.cli`).

Reads the store, never creates one; a bad argument or file, or a store that is not there, is one line,
exit 2; a store that is there but cannot be read (locked, corrupt, not MLflow's) one line, exit 4.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

from .core.exit_codes import EXIT_OK, EXIT_USAGE
from .core.registry import EQUIVALENCE_MARGIN_RANGE

__all__ = ["cmd_report", "margin_flag", "report_parser", "store_faults", "telemetry_report"]


def margin_flag(text: str | None) -> float | None:
    """``--margin``: a number of mAP points in ``EQUIVALENCE_MARGIN_RANGE``, or None (not given); anything
    else is ValueError."""
    if text is None:
        return None
    value = float(text)  # ValueError for 'abc'
    lo, hi = EQUIVALENCE_MARGIN_RANGE
    if not lo <= value <= hi:  # also refuses nan
        raise ValueError(text)
    return value


@contextmanager
def store_faults(uri: str):
    """A store fault raised inside the block (MLflow's, SQLAlchemy's, SQLite's) as one
    :class:`~.tracking.store.StoreError` line (exit 4), as ``run`` says it."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only a store fault is turned into a line; the rest is raised
        from .tracking.store_faults import store_error

        fault = store_error(exc, uri)
        if fault is not None:
            raise fault from exc
        raise


def cmd_report(args) -> int:
    """Reads the store, never creates one: a missing store is one line, exit 2 (a wrong path).

    A study FILE names the study and gives its ``report.equivalence_margin`` (a bad file: one line,
    exit 2, as everywhere); ``--margin`` overrides it."""
    from .report import write_report
    from .report.out_format import resolve_format
    from .tracking.store import open_store, resolve_tracking_uri

    if args.telemetry and args.compare:
        print("lsbench: error: --telemetry and --compare are two different reports; give one", file=sys.stderr)
        return EXIT_USAGE
    if args.telemetry and (args.metric is not None or args.margin is not None):
        given = " and ".join(f for f, v in (("--metric", args.metric), ("--margin", args.margin)) if v is not None)
        print(
            f"lsbench: error: --telemetry: the telemetry table has no mAP column and no verdicts, so {given} "
            f"would change nothing in it; drop {'them' if ' and ' in given else 'it'}, or leave out --telemetry "
            "for the mAP tables",
            file=sys.stderr,
        )
        return EXIT_USAGE
    format_given = args.format is not None
    try:
        args.format = resolve_format(args.format, args.out)
    except ValueError as e:
        print(f"lsbench: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        margin = margin_flag(args.margin)
    except ValueError:
        lo, hi = EQUIVALENCE_MARGIN_RANGE
        print(
            f"lsbench: error: --margin {args.margin}: the equivalence margin is a number of mAP points from "
            f"{lo:g} to {hi:g} (e.g. 1.0)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.file:
        from .study import load_study

        study = load_study(args.file, allow_large_grid=True)  # not run here: the grid's size does not matter
        if args.study and args.study != study.name:
            print(
                f"lsbench: error: --study {args.study}: {args.file} is study {study.name!r}; give one or the other",
                file=sys.stderr,
            )
            return EXIT_USAGE
        args.study = study.name
        margin = study.report.equivalence_margin if margin is None else margin
        from .study.seed_plan import planned_trials

        trial_ids = {t.trial_id for t in planned_trials(study)}  # the file's trials, not every run of its name
    else:
        trial_ids = None
    uri = open_store(resolve_tracking_uri(args.tracking_uri, args.runs_dir), create=False)
    with store_faults(uri):  # a store that fails while it is read (locked meanwhile, ...): one line, exit 4
        if args.telemetry:
            return telemetry_report(uri, args, format_given)
        from .report.stats import DEFAULT_MARGIN

        text, out = write_report(
            uri,
            study=args.study,
            fmt=args.format,
            out=args.out,
            metric=args.metric or "final_map",
            reports_dir=args.reports_dir,
            plots=not args.no_plots,
            margin=DEFAULT_MARGIN if margin is None else margin,
            compare=args.compare,
            trial_ids=trial_ids,
        )
    if out is None:  # --out -: the report itself is the output
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    elif args.format == "html" or args.out:
        print(out)  # a self-contained page with base64 images: the path, not the page
    else:
        print(text)
        print(f"(written to {out})", file=sys.stderr)
    return 0


def telemetry_report(uri: str, args, format_given: bool) -> int:
    """``report --telemetry``: per-row flush, saturation, scales and skipped steps (markdown only).

    ``format_given``: ``--format`` was on the command line (else the format came from ``--out``'s name)."""
    from .report.write import write_telemetry_report

    if args.format != "markdown":
        why = (
            f"drop --format {args.format}"
            if format_given
            else f"--out {args.out} names a {args.format} file: give an --out ending in .md, a folder, or -"
        )
        print(f"lsbench: error: --telemetry: the telemetry table is markdown only; {why}", file=sys.stderr)
        return EXIT_USAGE
    text, out = write_telemetry_report(uri, study=args.study, out=args.out)
    if out is None:
        sys.stdout.write(text)
    else:
        print(out)
    return EXIT_OK


def report_parser(sub, store_args) -> None:
    """``lsbench report``'s arguments, on the ``sub`` parsers of :func:`lossscale_bench.cli.build_parser`."""
    sp = sub.add_parser("report", help="mAP tables from the MLflow store")
    sp.add_argument(
        "file", nargs="?", help="study YAML file: report that study, with its report settings (the equivalence margin)"
    )
    sp.add_argument("--study", default=None, help="the study's name (default: every study in the store)")
    sp.add_argument(
        "--format",
        choices=("markdown", "csv", "html", "latex"),
        default=None,
        help="default: what --out's extension says (.md, .csv, .html, .tex), else markdown",
    )
    sp.add_argument(
        "--out",
        default=None,
        help="file to write, or a folder to write it in, or - for standard output (default: reports/<study>.<ext>)",
    )
    from .report.metric_names import REPORT_METRICS  # names only: no pandas, --help stays instant

    sp.add_argument(
        "--metric",
        default=None,
        choices=tuple(REPORT_METRICS),
        help="final_map (default: mAP at the last evaluation), final_map_50 (mAP@0.5) "
        "or best_map (the best evaluation's); shown in percent",
    )
    sp.add_argument(
        "--reports-dir",
        default="reports",
        help="folder the report goes to when --out is not given (<study>.<ext>; plots beside it)",
    )
    sp.add_argument("--no-plots", action="store_true", help="tables only, no plots")
    sp.add_argument(
        "--telemetry",
        action="store_true",
        help="instead of mAP: per row, the share of gradient elements flushed and saturated "
        "(activation and parameter gradients), loss scales and skipped steps, over seeds",
    )
    sp.add_argument(
        "--compare",
        action="store_true",
        help="instead of the tables: every pair of rows of each table (paired Δ, Holm-corrected "
        "verdicts, P(A > B)) and a ranking with the groups that cannot be told apart",
    )
    sp.add_argument(
        "--margin",
        default=None,
        metavar="POINTS",
        help="equivalence margin in mAP points (default: the study file's report.equivalence_margin, "
        "else 1.0): a difference the two one-sided tests put inside ±POINTS is 'equivalent'",
    )
    store_args(sp)
    sp.set_defaults(func=cmd_report)
