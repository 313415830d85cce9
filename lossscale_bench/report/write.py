"""``write_report``: load a study's runs, render one format, draw its plots, write the files.

The one place a report touches the file system.  What it puts together comes
from below: :func:`~lossscale_bench.report.runs.load_runs` (the store),
:func:`~lossscale_bench.report.renderers.render` (the tables, one renderer
per format) and :func:`~lossscale_bench.report.plots.study_plots` (imported
only when plots are drawn, so a tables-only report never loads matplotlib).
html embeds the plots in the page; markdown links PNG files written beside it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .metric_names import check_metric
from .renderers import FORMATS, render
from .runs import ReportError, load_runs

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["write_report"]


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


def _report_path(out: str | Path | None, reports_dir: str | Path, name: str) -> Path:
    """Where the report goes: ``out``, or ``name`` inside it when it is a folder, else in ``reports_dir``."""
    if out is None or str(out) == "-":
        return Path(reports_dir) / name
    if Path(out).is_dir() or str(out).endswith(("/", "\\")):
        return Path(out) / name
    return Path(out)


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
) -> tuple[str, Path | None]:
    """Load, render and write a report; returns (text, path).

    The file is ``out`` when given, else ``<reports_dir>/<study or 'all'>.<ext>``; an ``out``
    that is a folder (or ends with ``/``) gets that file name inside it. ``out="-"`` writes
    nothing (the caller prints the text; path None): markdown then has no plots, since its
    plots are files beside the report.
    ``plots`` (html and markdown only): draw the study plots
    (:func:`lossscale_bench.report.plots.study_plots`); html embeds them (with
    ``images``) as base64 in one self-contained page, markdown writes them as
    ``<stem>_<plot>.png`` beside the report and links them in a ``Plots``
    section.  csv and latex never have plots.
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    check_metric(metric)
    from ..tracking.store import ensure_artifact_scheme

    ensure_artifact_scheme()  # plots read store-relative artifacts even where the entry point is not installed
    runs = load_runs(tracking_uri, study)
    if len(runs) == 0:
        where = f"study {study!r}" if study else "any study"
        raise ReportError(f"no trial runs for {where} in {tracking_uri}")
    to_stdout = str(out) == "-"
    path = _report_path(out, reports_dir, f"{study or 'all'}.{FORMATS[fmt]}")
    pictures: list[tuple[str, str, bytes]] = []  # (name, title, png)
    if plots and (fmt == "html" or (fmt == "markdown" and not to_stdout)):
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
    if to_stdout:
        return text, None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for fpath, png in files:  # pictures first: the report never links a missing file
            fpath.write_bytes(png)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write report to {path}: {e.strerror or e}") from None
    return text, path
