"""Every row against every other row of a table, and a ranking: ``lsbench report --compare``.  (No MLflow.)

Why beside the ``vs baseline`` column: a reader of a loss-scaling table asks
"is adaptive better than a good fixed scale?", a question between two rows
neither of which is the baseline.  For each table of the report (study
setting, model, batch size) every pair of rows that finished with a value is
compared the way a row is compared with the baseline
(:func:`lossscale_bench.report.verdicts.compare_cells`: paired when both rows
finished the same seeds, else Welch; TOST at the equivalence margin; P(A > B)),
and, because k rows make k(k−1)/2 comparisons and some would come out
"significant" by chance, the difference tests' p-values are corrected by Holm
over the pairs of that table before a pair is called better or worse.
Equivalence is each pair's own TOST, not corrected.

The ranking orders the rows by mean and gives the groups the pairwise tests
cannot separate as a compact letter display: two rows that share a letter are
not significantly different after Holm.  The letters are the maximal sets of
rows with no significant pair inside (Piepho's insert-and-absorb, 2004), named
a, b, ... from the best row down.

Pure pandas and :mod:`.stats`: the input is ``summarize(runs, metric, margin,
values=True)``; the renderers (:mod:`.renderers.compare`) word the result.
"""

from __future__ import annotations

import itertools
import math
import string

import pandas as pd

from .baseline import TABLE_KEYS, VERDICT_NUMBERS
from .cell_text import higher_is_better, metric_scale
from .stats import ALPHA, DEFAULT_MARGIN, decide, format_margin, format_p, holm
from .summary import table_labels
from .verdicts import compare_cells, diverged_against, skew_text

__all__ = ["PAIR_COLUMNS", "RANK_COLUMNS", "compare_rows", "letter_groups"]

#: ``table``: the table's number in report order (0, 1, ...), what ties a pair to its ranking
_TABLE = ["table", "study", "setting", "setting_id", "model", "model_name", "batch_size", "metric"]
#: one line per pair of rows of one table; numbers in the metric's unit (fractions for mAP)
PAIR_COLUMNS = _TABLE + [
    "row_a",
    "label_a",
    "precision_a",
    "row_b",
    "label_b",
    "precision_b",
    "test",
    "n_a",
    "n_b",
    "mean_a",
    "mean_b",
    "diff",
    "diff_ci_low",
    "diff_ci_high",
    "half_width",
    "p_value",
    "p_holm",
    "tost_p",
    "tost_ci_low",
    "tost_ci_high",
    "margin",
    "seeds_needed",
    "p_better",
    "p_better_low",
    "p_better_high",
    "outcome",
    "verdict",
]
#: one line per row with a value, best first
RANK_COLUMNS = _TABLE + ["rank", "row", "label", "precision", "cell", "mean", "std", "n", "group"]


def letter_groups(order: list, different: set[frozenset]) -> dict:
    """Compact letter display: item -> its letters (``"a"``, ``"ab"``), ``order`` best first.

    ``different``: the pairs (frozensets of two items) that are significantly
    different.  Each letter is a maximal set of items with no different pair in
    it (insert-and-absorb: start from one set of all items; for each different
    pair split every set holding both into one without each; drop sets inside
    another).  Letters follow ``order``: the set holding the best item is ``a``.
    """
    groups: list[set] = [set(order)]
    for pair in different:
        i, j = tuple(pair)
        split = []
        for g in groups:
            split += [g - {i}, g - {j}] if i in g and j in g else [g]
        # absorb: a set inside another says nothing more (and duplicates collapse)
        unique = list({frozenset(g) for g in split if g})
        groups = [set(g) for g in unique if not any(g < h for h in unique)]
    rank = {item: k for k, item in enumerate(order)}
    groups.sort(key=lambda g: sorted(rank[x] for x in g))
    names = _letters(len(groups))
    return {item: "".join(n for n, g in zip(names, groups) if item in g) for item in order}


def _letters(k: int) -> list[str]:
    """a..z, then aa, ab, ... (a table with more than 26 groups is unlikely, not impossible)."""
    out: list[str] = []
    for size in itertools.count(1):
        for t in itertools.product(string.ascii_lowercase, repeat=size):
            if len(out) == k:
                return out
            out.append("".join(t))
    return out  # pragma: no cover


def _pair_verdict(outcome: str, v: dict, p_holm: float, shown_margin: float, alpha: float) -> str:
    """A's verdict against B: ``better (paired, Holm p=0.004)``, ``equivalent (±1.0, paired TOST p=0.01)``,
    ``inconclusive (paired, p=0.03, Holm p=0.09)`` (the raw p beside Holm's: a reader sees what the
    correction changed), ``too few seeds``."""
    paired = v["test"] == "paired"
    how = "paired and Wilcoxon signed-rank, " if v.get("skewed") else ("paired, " if paired else "")
    if outcome in ("better", "worse"):
        return f"{outcome} ({how}Holm {format_p(p_holm, alpha)})"
    if outcome == "equivalent":
        how = "paired and rank " if v.get("skewed") else ("paired " if paired else "")
        return f"equivalent (±{format_margin(shown_margin)}, {how}TOST {format_p(v.get('tost_decide', v['tost_p']), alpha)})"
    if outcome == "inconclusive":
        return f"inconclusive ({how}{format_p(v.get('p_decide', v['p_value']), alpha)}, Holm {format_p(p_holm, alpha)})"
    return v["verdict"]  # too few seeds, no seed variance


def _table_pairs(g: pd.DataFrame, labels: dict, margin: float, scale: float, higher: bool, alpha: float) -> list[dict]:
    """The pairs of one table (rows with a value, in row order), Holm-corrected over the table."""
    idx = [i for i in g.index if g.at[i, "n"] > 0]
    found = []
    for i, j in itertools.combinations(idx, 2):
        a, b = g.loc[i], g.loc[j]
        v = compare_cells(
            a["values"],
            a["values_by_seed"],
            b["values"],
            b["values_by_seed"],
            margin=margin,
            alpha=alpha,
            higher_is_better=higher,
            shown_scale=scale,
        )
        found.append((i, j, v))
    # the p a pair is decided on: the t-test's, or the signed-rank test's where the differences look skewed
    corrected = holm([v.get("p_decide", v["p_value"]) for *_, v in found], alpha)
    out = []
    for (i, j, v), p_holm in zip(found, corrected):
        a, b = g.loc[i], g.loc[j]
        tested = not math.isnan(v["p_value"])
        outcome = (
            decide(p_holm, v.get("tost_decide", v["tost_p"]), v["diff"], alpha, higher) if tested else v["outcome"]
        )
        verdict = _pair_verdict(outcome, v, p_holm, margin * scale, alpha) + (
            skew_text(v, alpha) if v.get("skewed") else ""
        )
        ended = [(int(r["n_diverged"]), int(r["n"]) + int(r["n_diverged"])) for r in (a, b)]
        kept = diverged_against(
            {**v, "outcome": outcome, "verdict": verdict}, *ended[0], *ended[1], who=(labels[i], labels[j])
        )
        outcome, verdict = kept["outcome"], kept["verdict"]
        out.append(
            {
                **{c: a[c] for c in _TABLE},
                "row_a": a["row"],
                "label_a": labels[i],
                "precision_a": a["precision"],
                "row_b": b["row"],
                "label_b": labels[j],
                "precision_b": b["precision"],
                "test": v["test"],
                "n_a": v["n"],
                "n_b": v["n_baseline"],
                "mean_a": v["mean"],
                "mean_b": v["mean_baseline"],
                **{c: v[c] for c in VERDICT_NUMBERS},
                "p_holm": p_holm,
                "outcome": outcome,
                "verdict": verdict,
                "_a": i,
                "_b": j,
            }
        )
    return out


def _table_ranking(g: pd.DataFrame, labels: dict, pairs: list[dict], higher: bool) -> list[dict]:
    """The rows with a value, best mean first (ties: row order), with their letters."""
    idx = [i for i in g.index if g.at[i, "n"] > 0]
    order = sorted(idx, key=lambda i: -g.at[i, "mean"] if higher else g.at[i, "mean"])
    different = {frozenset((p["_a"], p["_b"])) for p in pairs if p["outcome"] in ("better", "worse")}
    letters = letter_groups(order, different)
    return [
        {
            **{c: g.at[i, c] for c in _TABLE},
            "rank": k + 1,
            "row": g.at[i, "row"],
            "label": labels[i],
            "precision": g.at[i, "precision"],
            "cell": g.at[i, "cell"],
            "mean": g.at[i, "mean"],
            "std": g.at[i, "std"],
            "n": g.at[i, "n"],
            "group": letters[i],
        }
        for k, i in enumerate(order)
    ]


def compare_rows(
    summary: pd.DataFrame, margin: float = DEFAULT_MARGIN, alpha: float = ALPHA
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs, ranking) of every table in ``summary`` (from ``summarize(..., values=True)``).

    ``margin`` is in the unit the tables show (mAP points).  ``pairs``
    (:data:`PAIR_COLUMNS`): row a against row b, a before b in row order, Δ =
    a − b, ``p_holm`` over the pairs of the table, ``outcome``: ``better`` /
    ``worse`` (Holm p < alpha; a better than b or not), ``equivalent`` (TOST p <
    alpha), ``inconclusive``, ``too few`` or ``no variance``; ``verdict`` words
    it.  ``ranking`` (:data:`RANK_COLUMNS`): the rows with a value, best mean
    first, ``group`` their letters (:func:`letter_groups`).  Rows with no value
    (diverged, failed, running) are in neither.
    """
    if "values_by_seed" not in summary.columns:
        raise ValueError("compare_rows needs the seed values: summarize(runs, metric, margin, values=True)")
    pairs: list[dict] = []
    ranking: list[dict] = []
    for table, (_, g) in enumerate(summary.groupby(TABLE_KEYS, dropna=False, sort=False)):
        g = g.assign(table=table)
        metric = str(g["metric"].iloc[0])
        scale, higher = metric_scale(metric), higher_is_better(metric)
        labels = dict(zip(g.index, table_labels(g)))
        found = _table_pairs(g, labels, margin / scale, scale, higher, alpha)
        ranking += _table_ranking(g, labels, found, higher)
        pairs += found
    return (
        pd.DataFrame(pairs, columns=PAIR_COLUMNS + ["_a", "_b"])[PAIR_COLUMNS].reset_index(drop=True),
        pd.DataFrame(ranking, columns=RANK_COLUMNS),
    )
