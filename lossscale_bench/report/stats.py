"""Is a row's difference from the baseline more than seed noise?  (No MLflow here.)

The report compares each row's seed values with the baseline row's by
Welch's t-test (two-sided, unequal variances: a loss-scaling method may well
change the spread between seeds, not only the mean) and gives the difference
of means with a 95% confidence interval on the Welch–Satterthwaite degrees of
freedom.  The distributions come from scipy; nothing is hand-written.

When both rows ran the same seeds, :func:`paired_verdict` is the sharper test
and the report uses it: in lossscale_bench a seed fixes the initial weights
and the order of the batches, so two rows with the same seed start from the
same model and see the same data, and the per-seed difference removes the
seed-to-seed spread that Welch's test has to carry (on the CPU toy that
spread is ~1.5 mAP while same-seed fp16/fp32 differences are ~0.2).
``scipy.stats.ttest_rel`` on the common seeds; the interval is the paired
mean difference's, on n-1 degrees of freedom.

Only values go in: the caller decides what a value is.  The report passes
the seeds that finished with a value; diverged, failed and running seeds are
left out of the test (their cells count them), so a verdict is about the
seeds that trained, never a guessed number for the ones that did not.

scipy is imported inside :func:`noise_verdict`, so importing this module
(and the report, and ``lsbench --help``) stays cheap.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

__all__ = ["ALPHA", "noise_verdict", "paired_verdict", "format_p"]

#: significance level of the verdicts
ALPHA = 0.05

WORSE = "worse than baseline"
BETTER = "better than baseline"
NOISE = "within seed noise"
TOO_FEW = "too few seeds"
NO_VALUES = "no values"
NO_VARIANCE = "no seed variance"


def format_p(p: float, alpha: float = ALPHA) -> str:
    """``p=0.003``, ``p=0.42``, ``p<0.001``: two significant digits, more when
    rounding would put the shown value on the other side of ``alpha`` than the
    verdict (a ``worse ... (p=0.05)`` at alpha 0.05 would read as a contradiction)."""
    if math.isnan(p):
        return "p=nan"
    if p < 0.001:
        return "p<0.001"
    for digits in (2, 3, 4, 6):
        text = f"{p:.{digits}g}"
        if (float(text) < alpha) == (p < alpha):
            return f"p={text}"
    return f"p={p!r}"


def _decide(p: float, diff: float, alpha: float, higher_is_better: bool, prefix: str) -> dict:
    """``outcome`` and ``verdict`` text from a two-sided p-value and the sign of the difference."""
    if p < alpha:
        outcome, text = ("better", BETTER) if (diff > 0) == higher_is_better else ("worse", WORSE)
    else:
        outcome, text = "noise", NOISE
    return {"outcome": outcome, "verdict": f"{text} ({prefix}{format_p(p, alpha)})"}


def _mean_var(x: Sequence[float]) -> tuple[float, float]:
    n = len(x)
    mean = math.fsum(x) / n
    var = math.fsum((v - mean) ** 2 for v in x) / (n - 1) if n > 1 else math.nan
    return mean, var


def noise_verdict(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA,
                  higher_is_better: bool = True) -> dict:
    """Compare sample ``a`` (a row's seed values) with ``b`` (the baseline's).

    Returns a dict:

    * ``n``, ``n_baseline``, ``mean``, ``mean_baseline``;
    * ``diff`` = mean(a) − mean(b), ``diff_ci_low``/``diff_ci_high``: its
      ``1 - alpha`` confidence interval, ``t.ppf(1 - alpha/2, df)`` times the
      Welch standard error; ``df``: Welch–Satterthwaite degrees of freedom;
    * ``t``, ``p_value``: ``scipy.stats.ttest_ind(a, b, equal_var=False)``;
    * ``outcome``: ``worse`` | ``better`` | ``noise`` | ``too few`` |
      ``no values`` | ``no variance``; ``verdict``: the text the report shows,
      e.g. ``worse than baseline (p=0.003)``.

    ``higher_is_better`` says which sign of ``diff`` is "better".  Fewer than
    two values on either side cannot estimate a spread: ``too few seeds`` (no
    values at all in ``a``: ``no values``).  When both sides have zero spread
    the t statistic is undefined: ``no seed variance``, not a p-value scipy
    would compute from a division by zero.  Statistics that cannot be
    computed are NaN.
    """
    a = [float(v) for v in a]
    b = [float(v) for v in b]
    nan = math.nan
    out = {"n": len(a), "n_baseline": len(b), "mean": nan, "mean_baseline": nan, "diff": nan,
           "diff_ci_low": nan, "diff_ci_high": nan, "df": nan, "t": nan, "p_value": nan, "test": "welch"}
    if a:
        out["mean"] = _mean_var(a)[0]
    if b:
        out["mean_baseline"] = _mean_var(b)[0]
    if a and b:
        out["diff"] = out["mean"] - out["mean_baseline"]
    if not a:
        return {**out, "outcome": "no values", "verdict": NO_VALUES}
    if len(a) < 2 or len(b) < 2:
        return {**out, "outcome": "too few", "verdict": TOO_FEW}

    (_, va), (_, vb) = _mean_var(a), _mean_var(b)
    sa, sb = va / len(a), vb / len(b)
    se2 = sa + sb
    if se2 == 0.0:
        return {**out, "outcome": "no variance", "verdict": NO_VARIANCE}

    from scipy import stats

    with warnings.catch_warnings():
        # one side constant: scipy warns about "catastrophic cancellation" although the test is fine
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_ind(a, b, equal_var=False)
    df = se2 ** 2 / (sa ** 2 / (len(a) - 1) + sb ** 2 / (len(b) - 1))
    half = float(stats.t.ppf(1.0 - alpha / 2.0, df)) * math.sqrt(se2)
    p = float(res.pvalue)
    out.update(t=float(res.statistic), p_value=p, df=df,
               diff_ci_low=out["diff"] - half, diff_ci_high=out["diff"] + half)
    return {**out, **_decide(p, out["diff"], alpha, higher_is_better, "")}


def paired_verdict(a: dict, b: dict, alpha: float = ALPHA, higher_is_better: bool = True) -> dict:
    """Compare a row with the baseline seed by seed: ``a``/``b`` map seed -> value.

    Uses the seeds both have (``n`` of them). Same keys and meaning as
    :func:`noise_verdict`, plus ``test``: ``paired``. Fewer than two common seeds:
    ``too few seeds``; identical per-seed differences: ``no seed variance``.
    """
    common = sorted(set(a) & set(b))
    x = [float(a[k]) for k in common]
    y = [float(b[k]) for k in common]
    nan = math.nan
    d = [u - v for u, v in zip(x, y)]
    out = {"n": len(common), "n_baseline": len(common), "mean": nan, "mean_baseline": nan, "diff": nan,
           "diff_ci_low": nan, "diff_ci_high": nan, "df": nan, "t": nan, "p_value": nan, "test": "paired"}
    if common:
        out.update(mean=_mean_var(x)[0], mean_baseline=_mean_var(y)[0], diff=_mean_var(d)[0])
    if not x:
        return {**out, "outcome": "no values", "verdict": NO_VALUES}
    if len(common) < 2:
        return {**out, "outcome": "too few", "verdict": TOO_FEW}
    md, vd = _mean_var(d)
    # differences equal up to float rounding (0.33-0.30 vs 0.34-0.31): no spread to test against
    if vd <= (1e-9 * max(abs(md), max(map(abs, x + y)))) ** 2:
        return {**out, "outcome": "no variance", "verdict": NO_VARIANCE}

    from scipy import stats

    res = stats.ttest_rel(x, y)
    df = len(d) - 1
    half = float(stats.t.ppf(1.0 - alpha / 2.0, df)) * math.sqrt(vd / len(d))
    p = float(res.pvalue)
    out.update(t=float(res.statistic), p_value=p, df=float(df),
               diff_ci_low=out["diff"] - half, diff_ci_high=out["diff"] + half)
    return {**out, **_decide(p, out["diff"], alpha, higher_is_better, "paired, ")}
