"""``lsbench report --compare`` in every format: per table, the pairwise comparisons and the ranking.

The numbers come from :func:`lossscale_bench.report.compare.compare_rows`;
this module words them (:func:`_compare_tables`, :func:`_compare_notes`, shared
by every format, as :mod:`..tables` is for the main report) and adds each
format's markup, reusing the main renderers' escaping.  csv is the two frames
in one file, a ``kind`` column (``pair`` | ``rank``) telling their lines apart.
"""

from __future__ import annotations

import html as _html
import math

import pandas as pd

from ...study.precisions import is_emulated
from ..cell_text import higher_is_better, metric_scale
from ..compare import PAIR_COLUMNS, RANK_COLUMNS, compare_rows
from ..metric_names import value_header
from ..stats import ALPHA, format_margin
from ..tables import (
    EMULATED_MARK,
    P_BETTER_NOTE,
    TOST_CI_NOTE,
    TableStudy,
    column_text,
    emulation_notes,
    interval_text,
    margin_text,
    metric_description,
    needs_text,
    p_better_text,
    table_heading,
)
from .csv import PERCENT_COLUMNS, to_csv
from .html import HTML_STYLE, md_inline_to_html
from .latex import latex_escape, md_inline_to_latex
from .markdown import md_table, md_text

__all__ = ["render_compare"]

#: compare columns in the metric's unit: percent (``_pct``) in the csv for mAP metrics
COMPARE_PERCENT_COLUMNS = (*PERCENT_COLUMNS, "mean_a", "mean_b")


def _symbol(metric: str) -> str:
    return ">" if higher_is_better(metric) else "<"


def _pair_headers(metric: str) -> list[str]:
    return ["A", "B", "Δ A − B [95% CI]", f"P(A {_symbol(metric)} B) [95%]", "Verdict"]


def _rank_headers(metric: str) -> list[str]:
    return ["Rank", "Loss scale", value_header(metric), "Group"]


def _label(label, precision) -> str:
    return str(label) + (f" {EMULATED_MARK}" if is_emulated(precision) else "")


def _delta_text(r, k: float) -> str:
    return "" if math.isnan(r["diff"]) else interval_text(r, k)


def _pair_row(r, metric: str) -> list[str]:
    k = metric_scale(metric)
    verdict = column_text(r["verdict"])
    if r["outcome"] == "inconclusive":
        verdict += needs_text(r, r["margin"] * k, min(r["n_a"], r["n_b"]))
    pb = p_better_text(r["p_better"], r["p_better_low"], r["p_better_high"], symbol="")
    return [
        _label(r["label_a"], r["precision_a"]),
        _label(r["label_b"], r["precision_b"]),
        _delta_text(r, k),
        pb,
        verdict,
    ]


def _compare_tables(pairs: pd.DataFrame, ranking: pd.DataFrame):
    """Yield (TableStudy, model, batch, pair rows, rank rows) per table, in report order; rows are lists of text."""
    for table, rg in ranking.groupby("table", sort=True):
        first = rg.iloc[0]
        metric = str(first["metric"])
        pg = pairs[pairs["table"] == table]
        rank_rows = [
            [str(r["rank"]), _label(r["label"], r["precision"]), str(r["cell"]), str(r["group"])]
            for _, r in rg.iterrows()
        ]
        yield (
            TableStudy(first["study"], column_text(first["setting"])),
            first["model"],
            first["batch_size"],
            [_pair_row(r, metric) for _, r in pg.iterrows()],
            rank_rows,
        )


def _compare_notes(summary: pd.DataFrame, metric: str, margin: float) -> list[str]:
    """The footnotes under one study's comparison tables."""
    m = margin_text(margin, metric)
    unit = "percentage points" if metric_scale(metric) != 1.0 else "the metric's unit"
    sym = _symbol(metric)
    lines = [
        metric_description(metric, summary["eval_metric"].dropna().tolist(), best=False),
        f"Pairwise: every two rows of a table that finished with a value, A before B in the study's row order; "
        f"Δ = A − B ({unit}) with its 95% interval ({TOST_CI_NOTE[:-1]}): a paired t-test of the per-seed "
        "differences when both rows finished the same seeds (marked paired: a seed fixes the initial weights and "
        "the batches), else Welch's t-test. The p-values are Holm-corrected over the pairs of the table: "
        f"better/worse: Holm p < {ALPHA:g}. "
        f"Otherwise, equivalent: the 95% two one-sided tests put the difference inside {m} (each pair's own "
        "test, not corrected); inconclusive: neither a difference nor equivalence shown at this n (the raw p "
        f"beside Holm's), with roughly how many seeds would bring the 95% interval to {m} if the spread stayed "
        f"as observed. The margin is the study's `report: {{equivalence_margin: {format_margin(margin)}}}` or "
        f"`lsbench report --margin`. P(A {sym} B): the probability that A beats B, {P_BETTER_NOTE}",
        "Ranking: rows by mean, best first, with the seeds' mean ± sample std (n); rows that share a letter "
        "cannot be told apart after Holm, rows with no letter in common are significantly different "
        "(a compact letter display).",
    ]
    empty = summary[pd.to_numeric(summary["n"], errors="coerce").fillna(0) == 0]
    if len(empty):
        names = ", ".join(dict.fromkeys(str(x) for x in empty["label"]))
        lines.append(f"Left out (no value: diverged, failed or still running on every seed): {names}.")
    lines += emulation_notes(summary["precision"].dropna())
    return lines


def _by_study(summary: pd.DataFrame, pairs: pd.DataFrame, ranking: pd.DataFrame):
    """Yield (study, its summary, its pairs, its ranking), in report order."""
    for study, sg in summary.groupby("study", dropna=False, sort=False):
        same = ranking["study"].astype(str) == str(study)
        tables = set(ranking.loc[same, "table"])
        yield study, sg, pairs[pairs["table"].isin(tables)], ranking[same]


def _as_markdown(summary, pairs, ranking, metric, margin) -> str:
    out: list[str] = []
    for study, sg, sp, sr in _by_study(summary, pairs, ranking):
        out += [f"## {md_text(study)}: pairwise comparisons and ranking", ""]
        for tstudy, model, bs, pair_rows, rank_rows in _compare_tables(sp, sr):
            out += [f"### {md_text(table_heading(tstudy, model, bs))}", ""]
            # labels (A, B; the ranked row's) are data: escaped as literal text
            pair_rows = [[md_text(a), md_text(b), *rest] for a, b, *rest in pair_rows]
            rank_rows = [[r[0], md_text(r[1]), *r[2:]] for r in rank_rows]
            if pair_rows:
                out += md_table(_pair_headers(metric), pair_rows) + [""]
            out += md_table(_rank_headers(metric), rank_rows) + [""]
        for note in _compare_notes(sg, metric, margin):
            out += [note, ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _html_table(headers: list[str], rows: list[list[str]], caption: str) -> list[str]:
    e = _html.escape
    return (
        [
            "<table>",
            f"<caption>{e(caption)}</caption>",
            "<thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr></thead>",
            "<tbody>",
        ]
        + ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
        + ["</tbody>", "</table>"]
    )


def _as_html(summary, pairs, ranking, metric, margin) -> str:
    e = _html.escape
    studies = ", ".join(str(s) for s in pd.unique(summary["study"]))
    title = f"Loss-scaling comparisons: {studies}"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{e(title)}</title>",
        f"<style>\n{HTML_STYLE}\ncaption {{ text-align: left; font-weight: bold; }}\n</style>",
        "</head>",
        "<body>",
        f"<h1>{e(title)}</h1>",
    ]
    for study, sg, sp, sr in _by_study(summary, pairs, ranking):
        out += [f'<section class="study" id="study-{e(str(study))}">', f"<h2>{e(str(study))}</h2>"]
        for tstudy, model, bs, pair_rows, rank_rows in _compare_tables(sp, sr):
            out.append(f"<h3>{e(table_heading(tstudy, model, bs))}</h3>")
            if pair_rows:
                out += _html_table(_pair_headers(metric), pair_rows, "Pairwise")
            out += _html_table(_rank_headers(metric), rank_rows, "Ranking")
        out += [f'<p class="note">{md_inline_to_html(n)}</p>' for n in _compare_notes(sg, metric, margin)]
        out.append("</section>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


def _latex_table(headers: list[str], rows: list[list[str]], caption: str, spec: str) -> list[str]:
    return [
        "",
        r"\begin{table}[ht]",
        r"\centering",
        r"\caption{" + latex_escape(caption) + "}",
        r"\begin{tabular}{" + spec + "}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in headers) + r" \\",
        r"\midrule",
        *(" & ".join(latex_escape(c) for c in r) + r" \\" for r in rows),
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{table}",
    ]


def _as_latex(summary, pairs, ranking, metric, margin) -> str:
    out = ["% lossscale_bench comparisons; needs \\usepackage{booktabs}"]
    for study, sg, sp, sr in _by_study(summary, pairs, ranking):
        out += ["", f"% study: {latex_escape(study)}"]
        for tstudy, model, bs, pair_rows, rank_rows in _compare_tables(sp, sr):
            heading = table_heading(tstudy, model, bs)
            if pair_rows:
                out += _latex_table(_pair_headers(metric), pair_rows, f"{heading}: pairwise", "lllll")
            out += _latex_table(_rank_headers(metric), rank_rows, f"{heading}: ranking", "rlrl")
        out.append("")
        for note in _compare_notes(sg, metric, margin):
            out += [md_inline_to_latex(note), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _as_csv(pairs: pd.DataFrame, ranking: pd.DataFrame) -> str:
    """One file: ``kind`` ``pair`` lines (:data:`PAIR_COLUMNS`), then ``rank`` lines (:data:`RANK_COLUMNS`)."""
    columns = ["kind"] + list(dict.fromkeys(PAIR_COLUMNS + RANK_COLUMNS))
    frames = [f.assign(kind=kind) for f, kind in ((pairs, "pair"), (ranking, "rank")) if len(f)]
    both = pd.concat(frames, ignore_index=True).reindex(columns=columns) if frames else pd.DataFrame(columns=columns)
    for c in ("table", "batch_size", "row_a", "row_b", "n_a", "n_b", "rank", "row", "n"):  # counts, not 0.0
        both[c] = pd.to_numeric(both[c], errors="coerce").astype("Int64")
    return to_csv(both, COMPARE_PERCENT_COLUMNS)


def render_compare(summary: pd.DataFrame, fmt: str, metric: str, margin: float) -> str:
    """``summary`` from ``summarize(runs, metric, margin, values=True)``; ``margin`` in the tables' unit."""
    pairs, ranking = compare_rows(summary, margin)
    if fmt == "csv":
        return _as_csv(pairs, ranking)
    return {"markdown": _as_markdown, "html": _as_html, "latex": _as_latex}[fmt](
        summary, pairs, ranking, metric, margin
    )
