"""A row against another on its seeds: the verdict and every number behind it.

:func:`compare_cells` pairs the rows seed by seed when :func:`can_pair` (then :func:`paired_verdict`:
``scipy.stats.ttest_rel``, paired TOST, the share of seeds won), else compares them unpaired
(:func:`noise_verdict`: Welch, Welch TOST, the Mann–Whitney P(>)).  The tests themselves, and why each
was chosen, are in :mod:`lossscale_bench.report.stats`; this module turns their numbers into the dict a
report row carries and the one-line verdict it shows (``worse than baseline (paired, p=0.003)``).

scipy is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

from .normality import NORMALITY_ALPHA
from .stats import ALPHA, decide, format_margin, format_p, mean_var, prob_better, seeds_needed, tost_p

__all__ = ["noise_verdict", "paired_verdict", "compare_cells", "can_pair", "skew_text", "diverged_against"]

WORSE = "worse than baseline"
BETTER = "better than baseline"
EQUIVALENT = "equivalent"
INCONCLUSIVE = "inconclusive"
TOO_FEW = "too few seeds"
NO_VALUES = "no values"
NO_VARIANCE = "no seed variance"


def _verdict_text(outcome: str, p: float, tost: float, paired: bool, shown_margin: float, alpha: float) -> str:
    """The ``vs baseline`` verdict: ``worse than baseline (paired, p=0.003)``, ``equivalent (±1.0, paired
    TOST p=0.01)``, ``inconclusive (paired, p=0.53)``."""
    if outcome == "equivalent":
        return (
            f"{EQUIVALENT} (±{format_margin(shown_margin)}, {'paired ' if paired else ''}TOST {format_p(tost, alpha)})"
        )
    text = {"better": BETTER, "worse": WORSE}.get(outcome, INCONCLUSIVE)
    return f"{text} ({'paired, ' if paired else ''}{format_p(p, alpha)})"


# --------------------------------------------------------------------------- a row against another


_NUMBERS = (
    "mean",
    "mean_baseline",
    "diff",
    "diff_ci_low",
    "diff_ci_high",
    "half_width",
    "df",
    "t",
    "p_value",
    "tost_p",
    "tost_ci_low",
    "tost_ci_high",
    "seeds_needed",
    "p_better",
    "p_better_low",
    "p_better_high",
    "shapiro_p",
    "wilcoxon_p",
    "rank_tost_p",
)


def _result(
    x: Sequence[float],
    y: Sequence[float],
    *,
    paired: bool,
    alpha: float,
    higher_is_better: bool,
    margin: float,
    shown_scale: float,
    t_result,
    df: float,
    se: float,
    var_kw: dict,
) -> dict:
    """Every number and the verdict of one comparison whose t-test ran (``t_result`` from scipy)."""
    from scipy import stats

    diff = mean_var(x)[0] - mean_var(y)[0]
    half = float(stats.t.ppf(1.0 - alpha / 2.0, df)) * se
    half_tost = float(stats.t.ppf(1.0 - alpha, df)) * se  # the 1 − 2·alpha interval TOST decides on
    p, tost = float(t_result.pvalue), tost_p(x, y, margin, paired)
    pb, pb_lo, pb_hi = prob_better(x, y, paired=paired, higher_is_better=higher_is_better)
    outcome = decide(p, tost, diff, alpha, higher_is_better)
    return {
        "t": float(t_result.statistic),
        "p_value": p,
        "df": float(df),
        "diff": diff,
        "diff_ci_low": diff - half,
        "diff_ci_high": diff + half,
        "half_width": half,
        "tost_p": tost,
        "tost_ci_low": diff - half_tost,
        "tost_ci_high": diff + half_tost,
        "seeds_needed": seeds_needed(margin, alpha, **var_kw),
        "p_better": pb,
        "p_better_low": pb_lo,
        "p_better_high": pb_hi,
        "outcome": outcome,
        "verdict": _verdict_text(outcome, p, tost, paired, margin * shown_scale, alpha),
        "skewed": False,
        "p_decide": p,
        "tost_decide": tost,
    }


def _rank_opinion(d: Sequence[float], margin: float) -> dict:
    """The normality check of the per-seed differences and the rank tests (:mod:`.normality`)."""
    from .normality import rank_tost_p, shapiro_p, wilcoxon_p

    return {"shapiro_p": shapiro_p(d), "wilcoxon_p": wilcoxon_p(d), "rank_tost_p": rank_tost_p(d, margin)}


def _skewed_result(v: dict, *, alpha: float, higher_is_better: bool, shown_margin: float) -> dict:
    """A paired comparison whose differences fail the normality check: a verdict needs the rank test too.

    Different only where the t-test and the Wilcoxon signed-rank test both say so, equivalent only
    where TOST and the rank TOST both do (the larger of each pair of p-values decides, so the rate of
    a false verdict is at most either test's); otherwise inconclusive.  The t-test's numbers stay.
    """
    w = 1.0 if math.isnan(v["wilcoxon_p"]) else v["wilcoxon_p"]
    rt = 1.0 if math.isnan(v["rank_tost_p"]) else v["rank_tost_p"]
    p_decide, tost_decide = max(v["p_value"], w), max(v["tost_p"], rt)
    outcome = decide(p_decide, tost_decide, v["diff"], alpha, higher_is_better)
    if outcome == "equivalent":
        head = (
            f"{EQUIVALENT} (±{format_margin(shown_margin)}, paired TOST {format_p(v['tost_p'], alpha)}, "
            f"rank TOST {format_p(rt, alpha)})"
        )
    else:
        word = {"better": BETTER, "worse": WORSE}.get(outcome, INCONCLUSIVE)
        head = f"{word} (paired, {format_p(v['p_value'], alpha)}, Wilcoxon signed-rank {format_p(w, alpha)})"
    return {
        **v,
        "outcome": outcome,
        "verdict": head + skew_text(v),
        "skewed": True,
        "p_decide": p_decide,
        "tost_decide": tost_decide,
    }


def skew_text(v: dict) -> str:
    """``; skewed or heavy-tailed differences (Shapiro–Wilk p=0.012): a verdict needs the rank test too``."""
    return (
        f"; skewed or heavy-tailed differences (Shapiro–Wilk {format_p(v['shapiro_p'], NORMALITY_ALPHA)}): "
        "a verdict needs the rank test too"
    )


def _check_margin(margin: float) -> None:
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"equivalence margin must be a finite number > 0, got {margin!r}")


def noise_verdict(
    a: Sequence[float],
    b: Sequence[float],
    *,
    margin: float,
    alpha: float = ALPHA,
    higher_is_better: bool = True,
    shown_scale: float = 1.0,
) -> dict:
    """Compare sample ``a`` (a row's seed values) with ``b`` (the baseline's), unpaired: Welch.

    Returns a dict:

    * ``n``, ``n_baseline``, ``mean``, ``mean_baseline``, ``test``: ``welch``, or empty where no
      test ran (too few seeds, no values, no seed variance: a csv row must not name a test that was not run);
    * ``diff`` = mean(a) − mean(b), ``diff_ci_low``/``diff_ci_high``: its
      ``1 - alpha`` confidence interval, ``half_width`` = ``t.ppf(1 - alpha/2, df)``
      times the Welch standard error; ``df``: Welch–Satterthwaite degrees of freedom;
    * ``t``, ``p_value``: ``scipy.stats.ttest_ind(a, b, equal_var=False)``;
    * ``margin`` (the values' unit), ``tost_p``: :func:`tost_p`, and ``tost_ci_low``/``tost_ci_high``:
      the ``1 - 2·alpha`` (90%) interval of ``diff`` it decides on (inside ±margin exactly when
      ``tost_p`` < alpha); ``seeds_needed``: :func:`seeds_needed` (seeds per row);
    * ``p_better``, ``p_better_low``, ``p_better_high``: :func:`prob_better` (no interval unpaired);
    * ``outcome``: ``worse`` | ``better`` | ``equivalent`` | ``inconclusive`` |
      ``too few`` | ``no values`` | ``no variance``; ``verdict``: the text the
      report shows, e.g. ``worse than baseline (p=0.003)``, ``equivalent (±1.0,
      TOST p=0.01)`` (the margin times ``shown_scale``), ``inconclusive (p=0.4)``.

    ``higher_is_better`` says which sign of ``diff`` is "better".  Fewer than
    two values on either side cannot estimate a spread: ``too few seeds`` (no
    values at all in ``a``: ``no values``).  When both sides have zero spread
    the t statistic is undefined: ``no seed variance``, not a p-value scipy
    would compute from a division by zero.  Statistics that cannot be
    computed are NaN.
    """
    _check_margin(margin)
    a = [float(v) for v in a]
    b = [float(v) for v in b]
    out = {"n": len(a), "n_baseline": len(b), "test": "", "margin": margin, **dict.fromkeys(_NUMBERS, math.nan)}
    if a:
        out["mean"] = mean_var(a)[0]
    if b:
        out["mean_baseline"] = mean_var(b)[0]
    if a and b:
        out["diff"] = out["mean"] - out["mean_baseline"]
    if not a:
        return {**out, "outcome": "no values", "verdict": NO_VALUES}
    if len(a) < 2 or len(b) < 2:
        return {**out, "outcome": "too few", "verdict": TOO_FEW}

    (_, va), (_, vb) = mean_var(a), mean_var(b)
    sa, sb = va / len(a), vb / len(b)
    se2 = sa + sb
    if se2 == 0.0:
        return {**out, "outcome": "no variance", "verdict": NO_VARIANCE}

    from scipy import stats

    with warnings.catch_warnings():
        # one side constant: scipy warns about "catastrophic cancellation" although the test is fine
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_ind(a, b, equal_var=False)
    df = se2**2 / (sa**2 / (len(a) - 1) + sb**2 / (len(b) - 1))
    return {
        **out,
        "test": "welch",
        **_result(
            a,
            b,
            paired=False,
            alpha=alpha,
            higher_is_better=higher_is_better,
            margin=margin,
            shown_scale=shown_scale,
            t_result=res,
            df=df,
            se=math.sqrt(se2),
            var_kw={"var_a": va, "var_b": vb},
        ),
    }


def paired_verdict(
    a: Mapping,
    b: Mapping,
    *,
    margin: float,
    alpha: float = ALPHA,
    higher_is_better: bool = True,
    shown_scale: float = 1.0,
) -> dict:
    """Compare a row with the baseline seed by seed: ``a``/``b`` map seed -> value.

    Uses the seeds both have (``n`` of them). Same keys and meaning as
    :func:`noise_verdict`, with ``test``: ``paired`` (where it ran), the t-test
    ``scipy.stats.ttest_rel`` and its interval on n−1 degrees of freedom,
    ``ttost_paired`` and P(>) over seeds. Fewer than two common seeds:
    ``too few seeds``; identical per-seed differences: ``no seed variance``.
    """
    _check_margin(margin)
    common = sorted(set(a) & set(b))
    x = [float(a[k]) for k in common]
    y = [float(b[k]) for k in common]
    d = [u - v for u, v in zip(x, y)]
    out = {
        "n": len(common),
        "n_baseline": len(common),
        "test": "",
        "margin": margin,
        **dict.fromkeys(_NUMBERS, math.nan),
    }
    if common:
        out.update(mean=mean_var(x)[0], mean_baseline=mean_var(y)[0], diff=mean_var(d)[0])
    if not x:
        return {**out, "outcome": "no values", "verdict": NO_VALUES}
    if len(common) < 2:
        return {**out, "outcome": "too few", "verdict": TOO_FEW}
    md, vd = mean_var(d)
    # differences equal up to float rounding (0.33-0.30 vs 0.34-0.31): no spread to test against
    if vd <= (1e-9 * max(abs(md), max(map(abs, x + y)))) ** 2:
        return {**out, "outcome": "no variance", "verdict": NO_VARIANCE}

    from scipy import stats

    res = stats.ttest_rel(x, y)
    v = {
        **out,
        "test": "paired",
        **_rank_opinion(d, margin),
        **_result(
            x,
            y,
            paired=True,
            alpha=alpha,
            higher_is_better=higher_is_better,
            margin=margin,
            shown_scale=shown_scale,
            t_result=res,
            df=len(d) - 1.0,
            se=math.sqrt(vd / len(d)),
            var_kw={"var_diff": vd},
        ),
    }
    if not math.isnan(v["shapiro_p"]) and v["shapiro_p"] < NORMALITY_ALPHA:
        return _skewed_result(v, alpha=alpha, higher_is_better=higher_is_better, shown_margin=margin * shown_scale)
    return v


def can_pair(a_by_seed: Mapping, n_a: int, b_by_seed: Mapping, n_b: int) -> bool:
    """Pair two rows seed by seed only when every value of both has its own seed (no seedless or
    repeated seeds: ``len(by_seed) == n``) and both finished the same seeds, at least two."""
    whole = len(a_by_seed) == n_a and len(b_by_seed) == n_b
    return whole and len(set(a_by_seed) & set(b_by_seed)) >= 2 and set(a_by_seed) == set(b_by_seed)


def compare_cells(
    a_vals: Sequence[float],
    a_by_seed: Mapping,
    b_vals: Sequence[float],
    b_by_seed: Mapping,
    *,
    margin: float,
    alpha: float = ALPHA,
    higher_is_better: bool = True,
    shown_scale: float = 1.0,
) -> dict:
    """Row a against row b: :func:`paired_verdict` when :func:`can_pair`, else :func:`noise_verdict`."""
    kw = {"margin": margin, "alpha": alpha, "higher_is_better": higher_is_better, "shown_scale": shown_scale}
    if can_pair(a_by_seed, len(a_vals), b_by_seed, len(b_vals)):
        # same seeds = same initial weights and batches: compare seed by seed
        return paired_verdict(a_by_seed, b_by_seed, **kw)
    return noise_verdict(a_vals, b_vals, **kw)


#: the ``outcome`` of a comparison in which one side diverged on more seeds than the other
DIVERGED = "diverged"


def diverged_against(
    v: dict, diverged: int, trained: int, other_diverged: int, other_trained: int, *, who=("", "baseline")
) -> dict:
    """``v`` (a comparison's result) with the diverged seeds counted against the side that diverged more.

    Diverged seeds have no value and are left out of the tests; a row that diverged on some of them
    and matches the other on the rest is not "equivalent" to it.  Where one side diverged on more
    seeds than the other, an ``equivalent``, ``inconclusive`` or untested outcome becomes
    :data:`DIVERGED` (``diverged on 1 of 3 seeds (never equivalent); the other seeds: ...``); a shown
    difference stays, with the count beside it.  ``who``: the two sides' names in the text (the row
    itself: empty).
    """
    if diverged == other_diverged:
        return v
    k, n, name = (diverged, trained, who[0]) if diverged > other_diverged else (other_diverged, other_trained, who[1])
    said = f"{name + ' ' if name else ''}diverged on {k} of {n} seeds"
    if v["outcome"] in ("better", "worse"):
        return {**v, "verdict": f"{v['verdict']}; {said}"}
    if v["outcome"] == "no values" and k == n:  # nothing but diverged seeds on that side
        return {**v, "outcome": DIVERGED, "verdict": said}
    return {**v, "outcome": DIVERGED, "verdict": f"{said} (never equivalent); the other seeds: {v['verdict']}"}
