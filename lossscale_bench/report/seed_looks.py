"""The verdicts of a study that adds seeds in rounds, and which rows need more.  (pandas, no MLflow.)

A study with ``seeds: {start, step, max, until: decided}`` is looked at after
every round of seeds (:mod:`.sequential` has the statistics).  Per table
(setting, model, batch size) the pairs are the rows against the table's
baseline row (as the report's ``vs baseline`` column), or, with
``all_pairs=True`` or in a table without a baseline, every pair of rows (as
``lsbench report --compare``).  The looks are replayed from the stored values
at every planned look a pair's two rows have reached, so the decisions are a
function of the store alone: an interrupted study resumes with the same ones,
and a rerun of a decided study trains nothing.

At a look, each pair still open gets the repeated p-value of its paired
t-test (:func:`.sequential.sequential_p`); Holm over the table's pairs
(:func:`.stats.holm`; a pair decided earlier keeps its p) decides
better/worse; otherwise a pair is equivalent where TOST reaches the spending
boundary of that look (each pair's own, as in the fixed-n report); otherwise
it stays open until the last look, where it is "not equivalent and not
different at max".

A decision is final.  ``final`` (:func:`seed_looks`) carries the pairs that an
earlier look decided (better, worse or equivalent, as ``lsbench run`` recorded
them on the study's parent run, with the ``max`` in force then): they keep that
verdict and are not looked at again, so raising ``max`` (whose boundaries differ
at every look: O'Brien–Fleming at n=3 is 4.96 with max 4 and 10.08 with max 6)
cannot reopen them.  Only the pairs that were open, or undecided at the old
``max``, go on; their looks are replayed with the new ``max``.  A ``max`` raised
after looking is outside the plan's stated error rates (the report says so).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import pandas as pd

from .metric_names import PERCENT
from .normality import looks_skewed
from .sequential import UNDECIDED_TEXT, sequential_p, t_boundaries
from .stats import ALPHA, holm

__all__ = ["DECIDED", "LOOK_COLUMNS", "pair_key", "reached", "rows_to_grow", "seed_looks"]

#: the outcomes that are final once a look reached them
DECIDED = ("better", "worse", "equivalent")

#: one line per pair: ``outcome`` better | worse | equivalent | continue | undecided; ``looks``: how many
#: looks the pair had, ``n`` the seeds at its last; ``p_seq``/``p_holm`` the repeated p-value and Holm's
LOOK_COLUMNS = [
    "setting_id",
    "model",
    "batch_size",
    "row_a",
    "label_a",
    "row_b",
    "label_b",
    "outcome",
    "looks",
    "n",
    "diff",
    "p_seq",
    "p_holm",
    "verdict",
    "final",
]


def pair_key(model, batch_size, row_a, row_b) -> str:
    """``ssd_tiny.b8.row1-row0``: one pair of one table, as the parent run's tags name it."""
    return f"{model}.b{batch_size}.row{row_a}-row{row_b}"


def reached(done_seeds: set, looks: list[int]) -> int:
    """The largest planned look whose seeds 0 .. look−1 all finished or diverged (0: none yet)."""
    best = 0
    for s in looks:
        if set(range(s)) <= set(done_seeds):
            best = s
    return best


def _pairs(g: pd.DataFrame, all_pairs: bool) -> list[tuple]:
    base = g.index[g["baseline"].astype(bool)]
    if len(base) and not all_pairs:
        b = base[0]
        return [(i, b) for i in g.index if i != b]
    return list(itertools.combinations(g.index, 2))


def _look_stats(a: Mapping, b: Mapping, upto: int) -> tuple[int, float, float]:
    """(n, mean difference, standard error) over the seeds below ``upto`` that both rows finished."""
    common = sorted(k for k in set(a) & set(b) if int(k) < upto)
    d = [float(a[k]) - float(b[k]) for k in common]
    n = len(d)
    if n < 2:
        return n, math.nan, math.nan
    mean = math.fsum(d) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in d) / (n - 1))
    return n, mean, sd / math.sqrt(n)


def _diverged(ended: set, values: Mapping, upto: int) -> set:
    """The seeds below ``upto`` that ended without a value (diverged)."""
    return {k for k in ended if k < upto} - {int(k) for k in values}


def _start_state(g: pd.DataFrame, pairs: list[tuple], final: Mapping) -> dict:
    """Each pair's state before the looks: open, or decided at an earlier look (kept, never looked at again)."""
    state = {p: {"outcome": "continue", "history": [], "p": math.nan, "diff": math.nan} for p in pairs}
    for p in pairs:  # decided at an earlier look: kept as it was, never looked at again
        kept = final.get(pair_key(g.at[p[0], "model"], g.at[p[0], "batch_size"], g.at[p[0], "row"], g.at[p[1], "row"]))
        if kept and kept.get("outcome") in DECIDED:
            state[p] = {
                "outcome": kept["outcome"],
                "history": [(int(kept["n"]), math.nan)] * int(kept["looks"]),
                "p": float(kept.get("p_seq", math.nan)),
                "diff": float(kept.get("diff", math.nan)) / PERCENT,
                "p_holm": float(kept.get("p_holm", math.nan)),
                "final": True,
            }
    return state


def _pair_row(g: pd.DataFrame, i, j, st: dict) -> dict:
    """One pair's line of :data:`LOOK_COLUMNS` from its state after the looks."""
    h = st["history"]
    word = st["outcome"]
    verdict = {"undecided": UNDECIDED_TEXT, "continue": "undecided, more seeds to come"}.get(word, word)
    if word == "stopped":
        verdict = f"stopped: {st['why']}, no comparison possible"
    notes = [
        "the differences looked skewed (Shapiro–Wilk p < 0.05): no decision at that look"
        if st.get("held") and word in ("continue", "undecided")
        else "",
        "one row diverged on more seeds: never equivalent" if st.get("lost") and word not in DECIDED[:2] else "",
    ]
    n = h[-1][0] if h else 0
    return {
        "setting_id": g.at[i, "setting_id"],
        "model": g.at[i, "model"],
        "batch_size": g.at[i, "batch_size"],
        "row_a": g.at[i, "row"],
        "label_a": g.at[i, "label"],
        "row_b": g.at[j, "row"],
        "label_b": g.at[j, "label"],
        "outcome": word,
        "looks": len(h),
        "n": n,
        "diff": st["diff"] * PERCENT,
        "p_seq": st["p"],
        "p_holm": st.get("p_holm", math.nan),
        "verdict": f"{verdict} ({len(h)} look{'s' if len(h) != 1 else ''}, n={n})"
        + "".join(f"; {x}" for x in notes if x),
        "final": bool(st.get("final", False)),
    }


def _table(
    g: pd.DataFrame,
    stage: Mapping,
    ended: Mapping,
    looks: list[int],
    maximum: int,
    margin: float,
    alpha: float,
    all_pairs: bool,
    spending: str,
    final: Mapping,
) -> list[dict]:
    pairs = _pairs(g, all_pairs)
    state = _start_state(g, pairs, final)
    for s in looks:
        open_now = [p for p in pairs if state[p]["outcome"] == "continue" and min(stage[p[0]], stage[p[1]]) >= s]
        if not open_now:
            continue
        equivalent = {}
        for p in open_now:
            a, b = g.at[p[0], "values_by_seed"], g.at[p[1], "values_by_seed"]
            lost = [_diverged(ended[k], g.at[k, "values_by_seed"], s) for k in p]
            for k, side in zip(p, lost):
                if side and len(side) == s:  # every seed of the row diverged: nothing more to learn from seeds
                    state[p].update(outcome="stopped", why=f"{g.at[k, 'label']} diverged on all {s} seeds")
            if state[p]["outcome"] == "stopped":
                continue
            n, mean, se = _look_stats(a, b, s)
            h = state[p]["history"]
            if n < 2 or (h and h[-1][0] == n):
                continue  # no new seed pair: no look
            t_abs = abs(mean) / se if se > 0 else (math.inf if mean else 0.0)
            h.append((n, t_abs))
            sizes = [k for k, _ in h]
            state[p].update(p=sequential_p([t for _, t in h], sizes, maximum, spending), diff=mean)
            d = [float(a[k]) - float(b[k]) for k in sorted(set(a) & set(b)) if int(k) < s]
            state[p]["held"] = looks_skewed(d)  # no decision at a look whose differences look skewed
            state[p]["lost"] = len(lost[0]) != len(lost[1])  # one row diverged more: never equivalent
            inside = abs(mean) + t_boundaries(sizes, maximum, alpha, spending)[-1] * se <= margin
            equivalent[p] = inside and not state[p]["lost"]
        corrected = dict(zip(pairs, holm([state[p]["p"] for p in pairs], alpha)))
        for p, inside in equivalent.items():
            st = state[p]
            st["p_holm"] = corrected[p]
            if st["held"]:
                st["outcome"] = "undecided" if s >= maximum else "continue"
            elif corrected[p] < alpha:
                st["outcome"] = "better" if st["diff"] > 0 else "worse"
            elif inside:
                st["outcome"] = "equivalent"
            elif s >= maximum:
                st["outcome"] = "undecided"
    for p in pairs:  # both rows at max and still open (too few values to look at): not decided at max
        if state[p]["outcome"] == "continue" and min(stage[p[0]], stage[p[1]]) >= maximum:
            state[p]["outcome"] = "undecided"
    return [_pair_row(g, i, j, st) for (i, j), st in state.items()]


def seed_looks(
    summary: pd.DataFrame,
    done: Mapping,
    looks: list[int],
    *,
    margin: float,
    alpha: float = ALPHA,
    all_pairs: bool = False,
    spending: str = "obf",
    final: Mapping | None = None,
) -> pd.DataFrame:
    """The pairs' decisions (:data:`LOOK_COLUMNS`) after the rounds in the store.

    ``summary``: ``summarize(runs, values=True)`` of the study's mAP (higher is
    better; values are fractions, ``diff`` is shown in points).  ``done``:
    (setting_id, model, batch_size, row) -> the seeds of that row that finished
    or diverged; a row has reached the largest planned look (``looks``, the
    last the plan's ``max``) whose seeds all did.  ``margin`` in mAP points;
    ``spending``: the alpha-spending function (:data:`.sequential.SPENDING`).
    ``final``: :func:`pair_key` -> an earlier look's decision (``outcome``, ``looks``, ``n``, ``diff`` in
    points, ``p_seq``, ``p_holm``); a decided one is kept as it is (``final`` True in the result).
    """
    out: list[dict] = []
    keys = ["setting_id", "model", "batch_size"]
    for _, g in summary.groupby(keys, dropna=False, sort=False):
        ended = {
            i: set(done.get((g.at[i, "setting_id"], g.at[i, "model"], g.at[i, "batch_size"], g.at[i, "row"]), set()))
            for i in g.index
        }
        stage = {i: reached(ended[i], looks) for i in g.index}
        out += _table(g, stage, ended, looks, looks[-1], margin / PERCENT, alpha, all_pairs, spending, final or {})
    return pd.DataFrame(out, columns=LOOK_COLUMNS)


def rows_to_grow(decisions: pd.DataFrame, done: Mapping, looks: list[int]) -> dict[tuple, int]:
    """(setting_id, model, batch_size, row) -> the seeds it should have after the next round.

    Both rows of every open pair go to the next planned look after the one
    they have both reached; rows in decided pairs only stay where they are.
    """
    want: dict[tuple, int] = {}
    for r in decisions.itertuples():
        if r.outcome != "continue":
            continue
        ka = (r.setting_id, r.model, r.batch_size, r.row_a)
        kb = (r.setting_id, r.model, r.batch_size, r.row_b)
        now = min(reached(done.get(ka, set()), looks), reached(done.get(kb, set()), looks))
        nxt = next((s for s in looks if s > now), looks[-1])
        for k in (ka, kb):
            want[k] = max(want.get(k, 0), nxt)
    return want
