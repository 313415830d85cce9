"""Study reports: MLflow runs → pandas → tables (markdown, csv, html, latex) + plots.

Pipeline::

    load_runs(uri, study)  -> one row per trial (latest run per trial_id)
    summarize(runs)        -> one row per table cell (study, model, batch, row)
    render(runs, fmt)      -> markdown | csv | html | latex text
    compare_rows(summary)  -> every pair of rows per table, and the ranking (report --compare)
    write_report(uri, ...) -> (text, path)   (+ plots: see lossscale_bench.report.plots)

The modules, imports only ever pointing down::

    write             write_report(): tables + plots to files
      ├─ renderers/   render(); one module per format: markdown, csv, html, latex;
      │    │          render_compare() (compare.py): --compare in every format
      │    └─ tables  rows and footnotes shared by the renderers
      ├─ plots        study and trial plots (imported when drawn)
      │    ├─ draw    line plots and bars: data in, PNG out
      │    ├─ heatmap layer x step heatmaps of a layer history
      │    └─ figure  matplotlib plumbing: a figure without pyplot, PNG bytes
      ├─ compare      compare_rows(): pairs of rows, Holm, ranking with letter groups
      ├─ seed_section a seed-plan study's looks, from its parent run's tags (markdown)
      └─ summary      summarize(), verdicts
           ├─ runs    load_runs(): the MLflow store contract
           └─ baseline  each row of a table against the table's baseline row
                └─ verdicts  a row against another: paired or Welch, the verdict text
                     └─ stats  t-tests, TOST, P(>), Holm (scipy, statsmodels)
    seed_looks        seed_looks(): a seed-plan study's verdicts after its rounds
      └─ sequential   group-sequential t-test and TOST: boundaries, repeated p-values
    sequential_sim    the rule simulated: its error rates and seeds used
    metric_names      the metrics a report can show, their headers and unit (no pandas)

The store contract is described in :mod:`lossscale_bench.report.runs`, the
seed statistics and verdicts in :mod:`lossscale_bench.report.summary`.

Why this file imports nothing up front: ``lsbench --help`` reads the metric
names from :mod:`~lossscale_bench.report.metric_names`, and importing any
submodule runs this file first; pandas here would cost ``--help`` most of a
second.  Every name the flat ``report`` module offered is still importable
from here (``from lossscale_bench.report import render``): the first use
imports the modules that define them (:pep:`562` module ``__getattr__``).
"""

from __future__ import annotations

__all__ = [
    "ReportError",
    "load_runs",
    "summarize",
    "render",
    "write_report",
    "compare_rows",
    "noise_verdict",
    "FORMATS",
    "REPORT_METRICS",
]

#: submodule (or, spelled out, a module of the study layer) -> the names this package offers from it
_EXPORTS: dict[str, tuple[str, ...]] = {
    "runs": ("ReportError", "load_runs", "derive_label", "model_name", "RUN_COLUMNS", "STATUSES", "TAG"),
    "lossscale_bench.study.precisions": ("is_emulated",),
    "stats": ("ALPHA", "DEFAULT_MARGIN"),
    "verdicts": ("noise_verdict", "paired_verdict", "compare_cells"),
    "compare": ("compare_rows", "letter_groups", "PAIR_COLUMNS", "RANK_COLUMNS"),
    "summary": ("summarize", "SUMMARY_COLUMNS", "RUNNING_TEXT"),
    "tables": ("EMULATED_MARK", "EMULATION_NOTES", "HEADERS", "SEEDS_NOTE", "VS_HEADER", "verdict_note"),
    "metric_names": ("REPORT_METRICS", "check_metric"),
    "renderers": (
        "FORMATS",
        "render",
        "render_compare",
        "render_markdown",
        "render_csv",
        "render_html",
        "render_latex",
        "from_csv",
        "latex_escape",
    ),
    "write": ("write_report", "check_margin"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    """``report.<name>`` on first use: import the modules that define the public names, then look it up."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import sys

    # all at once, and spelled out, so tests/test_structure.py sees these edges (and any circle through them)
    from ..study import precisions  # noqa: F401
    from . import compare, metric_names, renderers, runs, stats, summary, tables, verdicts, write  # noqa: F401

    home = module if module.startswith("lossscale_bench.") else f"{__name__}.{module}"
    value = getattr(sys.modules[home], name)
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
