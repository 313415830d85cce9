"""One renderer per report format, and :func:`render`, which picks one.

Each format is its own module (``markdown``, ``csv``, ``html``, ``latex``)
working from the summary (:func:`lossscale_bench.report.summary.summarize`)
and the rows and footnotes every format shares
(:mod:`lossscale_bench.report.tables`); a new report format is one module
here plus its line in :data:`FORMATS` and :func:`render`.  ``lsbench report --compare``'s
pairwise tables and ranking are :mod:`.compare`'s :func:`render_compare`, in the same formats.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ..metric_names import check_metric
from ..runs import ReportError
from ..stats import DEFAULT_MARGIN
from ..summary import summarize
from .compare import render_compare
from .csv import from_csv, render_csv
from .html import render_html
from .latex import latex_escape, render_latex
from .markdown import render_markdown

__all__ = [
    "FORMATS",
    "render",
    "render_compare",
    "render_markdown",
    "render_csv",
    "render_html",
    "render_latex",
    "from_csv",
    "latex_escape",
]


from ..out_format import FORMATS  # format name -> file extension


def render(
    df: pd.DataFrame,
    fmt: str = "markdown",
    metric: str = "final_map",
    *,
    images: Mapping[str, bytes] | None = None,
    title: str | None = None,
    margin: float = DEFAULT_MARGIN,
) -> str:
    """Render the runs (from :func:`~lossscale_bench.report.runs.load_runs`) or a summary
    (from :func:`~lossscale_bench.report.summary.summarize`).

    ``fmt``: markdown | csv | html | latex.  ``images`` (html only): plot name
    -> PNG bytes, embedded as base64 in the page's ``#plots`` section.
    ``margin``: the equivalence margin of the verdicts (mAP points) when runs
    are given; a summary keeps the one it was made with.
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    check_metric(metric)
    if "cell" in df.columns and "n_runs" in df.columns:
        summary, runs = from_csv(df), None  # a summary, perhaps read back from a report's csv
    else:
        summary, runs = summarize(df, metric, margin), df
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
