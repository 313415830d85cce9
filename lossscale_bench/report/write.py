"""``write_report``: load a study's runs, render one format, draw its plots, write the files.

The one place a report touches the file system.  What it puts together comes
from below: :func:`~lossscale_bench.report.runs.load_runs` (the store),
:func:`~lossscale_bench.report.renderers.render` (the tables, one renderer
per format) and :func:`~lossscale_bench.report.plots.study_plots` (imported
only when plots are drawn, so a tables-only report never loads matplotlib).
html embeds the plots in the page; markdown links PNG files written beside it.
``compare=True`` writes ``lsbench report --compare``'s pairwise tables and ranking
(:func:`~lossscale_bench.report.renderers.render_compare`) instead, without plots.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.registry import EQUIVALENCE_MARGIN_RANGE
from .metric_names import check_metric
from .renderers import FORMATS, render, render_compare
from .runs import ReportError, load_runs
from .stats import DEFAULT_MARGIN
from .summary import summarize

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["write_report", "write_telemetry_report", "check_margin"]


def _plot_list(tracking_uri: str, study: str | None, runs: pd.DataFrame, metric: str) -> list:
    try:
        from .plots import study_plots

        return study_plots(tracking_uri, study, runs=runs, metric=metric)
    except Exception as e:  # PlotError, matplotlib or MLflow errors: one line, and the way out
        msg = " ".join(str(e).split())
        raise ReportError(
            f"cannot draw the report's plots: {type(e).__name__}: {msg[:300]} "
            f"(plots=False / --no-plots writes the tables alone)"
        ) from None


def _markdown_plots(path: Path, pictures: list[tuple[str, str, bytes]]) -> tuple[str, list[tuple[Path, bytes]]]:
    """Markdown section linking PNG files beside ``path``: ``<stem>_<name>.png``."""
    from urllib.parse import quote

    from .figure import slug
    from .renderers.markdown import md_alt

    lines, files, used = ["", "## Plots", ""], [], set()
    for name, title, png in pictures:
        base = f"{path.stem}_{slug(name)}"
        fname, k = f"{base}.png", 2
        while fname in used:
            fname, k = f"{base}_{k}.png", k + 1
        used.add(fname)
        files.append((path.parent / fname, png))
        lines += [f"![{md_alt(title)}]({quote(fname)})", ""]
    return "\n".join(lines).rstrip("\n") + "\n", files


def check_margin(margin) -> float:
    """The equivalence margin (mAP points) if it is a number in ``EQUIVALENCE_MARGIN_RANGE``, else a
    one-line :class:`ReportError` (outside it the statistics underflow or overflow, and past 100 mAP
    points any two rows would be equivalent)."""
    lo, hi = EQUIVALENCE_MARGIN_RANGE
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not lo <= margin <= hi:
        raise ReportError(
            f"equivalence margin {margin!r}: a number of mAP points from {lo:g} to {hi:g} (e.g. {DEFAULT_MARGIN})"
        )
    return float(margin)


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
    margin: float = DEFAULT_MARGIN,
    compare: bool = False,
    trial_ids: Collection[str] | None = None,
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
    ``margin``: the equivalence margin of the verdicts, in mAP points (the study's
    ``report.equivalence_margin``). ``compare``: every pair of rows of each table
    and the ranking instead of the tables, in ``<study or 'all'>_compare.<ext>``
    by default; no plots.
    ``trial_ids``: the trials a study file lists (``lsbench report FILE`` passes its grid): see
    :func:`_only_listed`.
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    check_metric(metric)
    margin = check_margin(margin)
    from ..tracking.store import ensure_artifact_scheme

    ensure_artifact_scheme()  # plots read store-relative artifacts even where the entry point is not installed
    runs = load_runs(tracking_uri, study)
    if trial_ids is not None:
        runs = _only_listed(runs, set(trial_ids))
    if len(runs) == 0:
        where = f"study {study!r}" if study else "any study"
        raise ReportError(f"no trial runs for {where} in {tracking_uri}")
    to_stdout = str(out) == "-"
    path = _report_path(out, reports_dir, f"{study or 'all'}{'_compare' if compare else ''}.{FORMATS[fmt]}")
    from .seed_section import with_seed_section  # a study whose seeds were added until decided: its verdicts

    if compare:
        text = render_compare(summarize(runs, metric, margin, values=True), fmt, metric, margin)
        text = with_seed_section(text, tracking_uri, study, fmt)
        return (text, None) if to_stdout else (text, _write(path, text, []))
    pictures: list[tuple[str, str, bytes]] = []  # (name, title, png)
    if plots and (fmt == "html" or (fmt == "markdown" and not to_stdout)):
        pictures = [(p.name, p.title, p.png) for p in _plot_list(tracking_uri, study, runs, metric)]
    pictures += [(name, name, png) for name, png in (images or {}).items()]
    files: list[tuple[Path, bytes]] = []
    if fmt == "html":
        text = render(runs, fmt, metric, images={title: png for _, title, png in pictures}, margin=margin)
        text = with_seed_section(text, tracking_uri, study, fmt)
    else:
        text = with_seed_section(render(runs, fmt, metric, margin=margin), tracking_uri, study, fmt)
        if fmt == "markdown" and pictures:
            section, files = _markdown_plots(path, pictures)
            text += section
    if to_stdout:
        return text, None
    return text, _write(path, text, files)


def write_telemetry_report(
    tracking_uri: str, *, study: str | None = None, out: str | Path | None = None
) -> tuple[str, Path | None]:
    """``lsbench report --telemetry``: the telemetry table (markdown), written as :func:`write_report` writes.

    ``out`` None or ``-``: nothing is written (path None, the caller prints the text); a folder (or a name
    ending in ``/``): ``<study or 'all'>_telemetry.md`` inside it. A place that cannot be written is a
    one-line :class:`ReportError`, as for the tables.
    """
    from .telemetry_summary import render_telemetry_markdown, telemetry_rows

    text = render_telemetry_markdown(telemetry_rows(tracking_uri, study))
    if out is None or str(out) == "-":
        return text, None
    return text, _write(_report_path(out, ".", f"{study or 'all'}_telemetry.md"), text, [])


def _only_listed(runs, trial_ids: set[str]):
    """``runs`` without the trials of the file's own configuration that the file does not list.

    Why: a store can hold more trials of a study's current configuration than its file lists now (an
    earlier, longer seed list, a row since removed), and rows with different seed sets are compared
    unpaired (Welch), which widened the ranking study's intervals from ±0.7-1.1 to ±1.4-1.9 mAP.
    Trials of other configurations (earlier versions of the file) stay, in their own tables as
    before, and a file none of whose trials is in the store changes nothing (it is then read for its
    report settings only)."""
    listed = runs["trial_id"].isin(trial_ids)
    current = set(runs.loc[listed, "setting_id"].dropna())
    if not current:
        return runs
    return runs[listed | ~runs["setting_id"].isin(current)]


def _write(path: Path, text: str, files: list[tuple[Path, bytes]]) -> Path:
    """The report at ``path``, its pictures first (the report never links a missing file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for fpath, png in files:
            fpath.write_bytes(png)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write report to {path}: {e.strerror or e}") from None
    return path
