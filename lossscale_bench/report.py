"""Study reports: MLflow runs → pandas → tables (markdown, csv, html, latex) + plots.

Pipeline::

    load_runs(uri, study)  -> one row per trial (latest run per trial_id)
    summarize(runs)        -> one row per table cell (study, model, batch, row)
    render(runs, fmt)      -> markdown | csv | html | latex text
    write_report(uri, ...) -> (text, path)   (+ plots: see lossscale_bench.plots)

This module is the orchestration on top; the work is done below it, and
imports only ever point down::

    report                                   render(), write_report(): tables + plots
      ├─ report_markdown, report_csv,         one renderer per format
      │  report_html, report_latex
      │    └─ report_tables                   rows and footnotes shared by the renderers
      ├─ plots (→ plots_draw)                 study and trial plots (imported when drawn)
      └─ report_summary                       summarize(), verdicts; re-exports report_runs
           ├─ report_runs                     load_runs(): the MLflow store contract
           └─ report_stats                    t-tests (scipy)

The store contract is described in :mod:`lossscale_bench.report_runs`, the
seed statistics and verdicts in :mod:`lossscale_bench.report_summary`.  Every
name those modules had here before the split is still importable from here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from .report_csv import from_csv, render_csv
from .report_metrics import REPORT_METRICS, check_metric
from .report_html import render_html
from .report_latex import render_latex
from .report_markdown import render_markdown
from .report_summary import ReportError, load_runs, noise_verdict, summarize

# lived here before the split; still importable from here
from .report_latex import latex_escape  # noqa: F401
from .report_summary import (  # noqa: F401
    ALPHA,
    EMULATED_SUFFIX,
    MODEL_NAMES,
    RUN_COLUMNS,
    RUNNING_TEXT,
    STATUSES,
    SUMMARY_COLUMNS,
    TAG,
    derive_label,
    is_emulated,
    model_name,
    paired_verdict,
)
from .report_tables import EMULATED_MARK, EMULATION_NOTES, HEADERS, SEEDS_NOTE, VS_HEADER, _verdict_note  # noqa: F401

__all__ = [
    "ReportError",
    "load_runs",
    "summarize",
    "render",
    "write_report",
    "noise_verdict",
    "MODEL_NAMES",
    "FORMATS",
    "REPORT_METRICS",
]

#: format name -> file extension
FORMATS: dict[str, str] = {"markdown": "md", "csv": "csv", "html": "html", "latex": "tex"}


def render(
    df: pd.DataFrame,
    fmt: str = "markdown",
    metric: str = "final_map",
    *,
    images: Mapping[str, bytes] | None = None,
    title: str | None = None,
) -> str:
    """Render the runs (from :func:`load_runs`) or a summary (from :func:`summarize`).

    ``fmt``: markdown | csv | html | latex.  ``images`` (html only): plot name
    -> PNG bytes, embedded as base64 in the page's ``#plots`` section.
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    check_metric(metric)
    if "cell" in df.columns and "n_runs" in df.columns:
        summary, runs = from_csv(df), None  # a summary, perhaps read back from a report's csv
    else:
        summary, runs = summarize(df, metric), df
    if fmt == "csv":
        return render_csv(summary)
    if len(summary) == 0:
        raise ReportError("no trial runs to report")
    if fmt == "markdown":
        return render_markdown(summary, runs, metric)
    if fmt == "latex":
        return render_latex(summary, runs, metric)
    studies = [str(s) for s in pd.unique(summary["study"])]
    return render_html(summary, runs, metric, images, title or f"Loss-scaling report: {', '.join(studies)}")


def _plot_list(tracking_uri: str, study: str | None, runs: pd.DataFrame, metric: str) -> list:
    try:
        from .plots import study_plots

        return study_plots(tracking_uri, study, runs=runs, metric=metric)
    except Exception as e:  # PlotError, matplotlib or MLflow errors: one line, and the way out
        msg = " ".join(str(e).split())
        raise ReportError(f"cannot draw the report's plots: {type(e).__name__}: {msg[:300]} "
                          f"(plots=False / --no-plots writes the tables alone)") from None


def _md_alt(text: str) -> str:
    return re.sub(r"([\\\[\]])", r"\\\1", text)


def _markdown_plots(path: Path, pictures: list[tuple[str, str, bytes]]) -> tuple[str, list[tuple[Path, bytes]]]:
    """Markdown section linking PNG files beside ``path``: ``<stem>_<name>.png``."""
    from urllib.parse import quote

    from .plots import slug

    lines, files, used = ["", "## Plots", ""], [], set()
    for name, title, png in pictures:
        base = f"{path.stem}_{slug(name)}"
        fname, k = f"{base}.png", 2
        while fname in used:
            fname, k = f"{base}_{k}.png", k + 1
        used.add(fname)
        files.append((path.parent / fname, png))
        lines += [f"![{_md_alt(title)}]({quote(fname)})", ""]
    return "\n".join(lines).rstrip("\n") + "\n", files


def write_report(
    tracking_uri: str,
    *,
    study: str | None = None,
    fmt: str = "markdown",
    out: str | Path | None = None,
    metric: str = "final_map",
    reports_dir: str | Path = "reports",
    images: Mapping[str, bytes] | None = None,
    plots: bool = True,
) -> tuple[str, Path]:
    """Load, render and write a report; returns (text, path).

    The file is ``out`` when given, else ``<reports_dir>/<study or 'all'>.<ext>``.
    ``plots`` (html and markdown only): draw the study plots
    (:func:`lossscale_bench.plots.study_plots`); html embeds them (with
    ``images``) as base64 in one self-contained page, markdown writes them as
    ``<stem>_<plot>.png`` beside the report and links them in a ``Plots``
    section.  csv and latex never have plots.
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    check_metric(metric)
    from .tracking.store import ensure_artifact_scheme

    ensure_artifact_scheme()  # plots read store-relative artifacts even where the entry point is not installed
    runs = load_runs(tracking_uri, study)
    if len(runs) == 0:
        where = f"study {study!r}" if study else "any study"
        raise ReportError(f"no trial runs for {where} in {tracking_uri}")
    path = Path(out) if out is not None else Path(reports_dir) / f"{study or 'all'}.{FORMATS[fmt]}"
    pictures: list[tuple[str, str, bytes]] = []  # (name, title, png)
    if plots and fmt in ("html", "markdown"):
        pictures = [(p.name, p.title, p.png) for p in _plot_list(tracking_uri, study, runs, metric)]
    pictures += [(name, name, png) for name, png in (images or {}).items()]
    files: list[tuple[Path, bytes]] = []
    if fmt == "html":
        text = render(runs, fmt, metric, images={title: png for _, title, png in pictures})
    else:
        text = render(runs, fmt, metric)
        if fmt == "markdown" and pictures:
            section, files = _markdown_plots(path, pictures)
            text += section
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for fpath, png in files:  # pictures first: the report never links a missing file
            fpath.write_bytes(png)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write report to {path}: {e.strerror or e}") from None
    return text, path
