"""What the seeds can say about a difference between two rows.  (No MLflow, no pandas here.)

A row is compared with another (the table's baseline, or every other row for
``lsbench report --compare``) on the seeds that finished with a value:

* **a difference?** When both rows ran the same seeds, a paired t-test of the
  per-seed differences (``scipy.stats.ttest_rel``): in lossscale_bench a seed
  fixes the initial weights and the order of the batches, so two rows with the
  same seed start from the same model and see the same data, and the per-seed
  difference removes the seed-to-seed spread that an unpaired test has to carry
  (on the CPU toy that spread is ~1.5 mAP while same-seed fp16/fp32 differences
  are ~0.2).  Otherwise Welch's t-test (``ttest_ind(equal_var=False)``: a
  loss-scaling method may change the spread between seeds, not only the mean).
  The difference of means gets its 95% interval on the same degrees of freedom
  (paired: n−1; Welch: Welch–Satterthwaite), and its 90% interval, the one the
  equivalence test decides on (below).
* **or the same within a margin?** "No difference shown" is two answers that
  matter apart: the rows are equivalent within a margin a reader cares about,
  or there are too few seeds to say.  Two one-sided tests (TOST, statsmodels'
  ``ttost_paired`` / ``ttost_ind(usevar='unequal')``) at margin m tell them
  apart: ``equivalent (±m)`` when both reject (p < alpha, i.e. the 1 − 2·alpha
  interval lies inside ±m), else ``inconclusive``.
* **resolving power**: the half-width of the 95% interval at this n, and
  roughly how many seeds would bring it to ±m if the spread stayed as observed
  (:func:`seeds_needed`): what "inconclusive" would cost to resolve.
* **how often does it win?** P(row > other): paired, the share of seeds on
  which the row is ahead (ties count one half), with an exact binomial
  (Clopper–Pearson) 95% interval for the chance of winning on a seed: each
  seed is an independent trial, so k wins in n is a binomial count, and the
  interval is never of zero width (0 wins in 3: [0, 0.71]).  Unpaired, the
  Mann–Whitney probability U/(n·m) over all pairs of values, without an
  interval: the n·m pairs share their values, no exact interval exists, and a
  bootstrap over a handful of values that agree gives [1, 1], a certainty
  three seeds do not have.  It says what a t-test's mean hides: a row that
  wins on every seed by a little and one that wins big on one seed and loses
  on two.
* **many pairs at once**: Holm's correction (statsmodels ``multipletests``) over
  the pairs of one table (:func:`holm`), used by :mod:`.compare`.

Only values go in: the caller decides what a value is.  The report passes the
seeds that finished with a value; diverged, failed and running seeds are left
out (their cells count them), so a verdict is about the seeds that trained,
never a guessed number for the ones that did not.  Values and the margin are
in one unit (the report's: fractions for mAP); ``shown_scale`` only words the
margin as the tables show it (percent points).

The verdict of one row against another, built from these pieces, is in
:mod:`lossscale_bench.report.verdicts`.

scipy, numpy and statsmodels are imported inside the functions, so importing
this module (and the report, and ``lsbench --help``) stays cheap.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

__all__ = [
    "ALPHA",
    "DEFAULT_MARGIN",
    "decide",
    "holm",
    "seeds_needed",
    "prob_better",
    "clopper_pearson",
    "tost_p",
    "format_p",
    "format_margin",
    "mean_var",
]

#: significance level of the verdicts
ALPHA = 0.05
#: equivalence margin in the unit the tables show (mAP points): the study file's
#: ``report.equivalence_margin`` default (lossscale_bench.study.schema.ReportSpec)
DEFAULT_MARGIN = 1.0
#: seeds_needed gives up (inf) beyond this many seeds
MAX_SEEDS = 100_000


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


def format_margin(m: float) -> str:
    """``1.0``, ``0.5``, ``0.25``: one decimal at least, as the study file would write it."""
    return f"{m:.1f}" if round(m, 1) == m else f"{m:g}"


def mean_var(x: Sequence[float]) -> tuple[float, float]:
    """(mean, sample variance) of ``x``, by ``math.fsum``; the variance is NaN for one value."""
    n = len(x)
    mean = math.fsum(x) / n
    var = math.fsum((v - mean) ** 2 for v in x) / (n - 1) if n > 1 else math.nan
    return mean, var


# --------------------------------------------------------------------------- the pieces


def tost_p(x: Sequence[float], y: Sequence[float], margin: float, paired: bool) -> float:
    """p of the two one-sided tests that mean(x) − mean(y) lies inside (−margin, +margin).

    statsmodels: ``ttost_paired`` on aligned seeds, else ``ttost_ind(usevar='unequal')``
    (Welch's standard error and degrees of freedom, as the difference test).
    """
    import numpy as np
    from statsmodels.stats.weightstats import ttost_ind, ttost_paired

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # one side constant: the test is still defined
        if paired:
            return float(ttost_paired(x, y, -margin, margin)[0])
        return float(ttost_ind(x, y, -margin, margin, usevar="unequal")[0])


def seeds_needed(
    margin: float,
    alpha: float = ALPHA,
    *,
    var_diff: float | None = None,
    var_a: float | None = None,
    var_b: float | None = None,
) -> float:
    """Roughly how many seeds would bring the ``1 - alpha`` interval's half-width to ``margin``.

    From the observed spread, as if it stayed the same: paired (``var_diff``, the
    variance of the per-seed differences), half-width t(1−alpha/2, n−1)·sd/√n;
    Welch (``var_a``, ``var_b``) with n seeds on each side, t on the
    Welch–Satterthwaite df of equal n, (va+vb)²(n−1)/(va²+vb²), times √((va+vb)/n),
    so at the observed n it gives the interval the report prints.  The smallest
    n ≥ 2 that does it; ``inf`` beyond :data:`MAX_SEEDS`.  With 3 seeds the
    spread itself is uncertain, so this is an order of magnitude, not a plan.
    """
    from scipy import stats

    if var_diff is not None:
        total = var_diff

        def df(n: int) -> float:
            return n - 1.0
    else:
        total = var_a + var_b

        def df(n: int) -> float:
            return total**2 * (n - 1) / (var_a**2 + var_b**2)

    if total <= 0.0:
        return 2.0
    # t > z, so the normal approximation's n is a lower bound: start there and step up
    z = float(stats.norm.ppf(1.0 - alpha / 2.0))
    root = z * math.sqrt(total) / margin  # (not z²·total/margin²: margin² over- or underflows at the extremes)
    if not root * root <= MAX_SEEDS:  # also inf
        return math.inf
    start = root * root
    n = max(2, math.ceil(start))
    while n <= MAX_SEEDS:
        if float(stats.t.ppf(1.0 - alpha / 2.0, df(n))) * math.sqrt(total / n) <= margin:
            return float(n)
        n += 1
    return math.inf


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact binomial (Clopper–Pearson) interval for a chance seen ``k`` times in ``n``.

    Beta quantiles, ``confidence`` central: low = Beta(alpha/2; k, n−k+1) (0 when k = 0), high =
    Beta(1 − alpha/2; k+1, n−k) (1 when k = n); statsmodels' ``proportion_confint(method='beta')``.
    0 in 3: [0, 0.708]; 3 in 3: [0.292, 1]. Never of zero width for n ≥ 1.
    """
    from scipy import stats

    if not 0 <= k <= n or n < 1:
        raise ValueError(f"clopper_pearson: need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if k == 0 else float(stats.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1.0 - tail, k + 1, n - k))
    return low, high


def prob_better(
    x: Sequence[float], y: Sequence[float], *, paired: bool, higher_is_better: bool = True, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(P(x better than y), interval low, high).

    Paired (``x[i]``, ``y[i]`` the same seed): the share of seeds on which x is
    ahead, ties one half, with the :func:`clopper_pearson` interval of the
    chance that x is ahead on a seed.  A tie could have gone either way, so
    with ties the interval runs from the low end for the strict wins to the
    high end for wins and ties together (without ties: the exact interval
    itself).  Unpaired: the Mann–Whitney probability U/(n·m)
    (``scipy.stats.mannwhitneyu``'s U of x: pairs of values in which x is
    ahead, ties one half), interval NaN (the pairs are not independent
    trials; see the module docstring).  "Better" is higher unless
    ``higher_is_better`` is false.
    """
    import numpy as np
    from scipy import stats

    sign = 1.0 if higher_is_better else -1.0
    x, y = sign * np.asarray(x, dtype=float), sign * np.asarray(y, dtype=float)
    if paired:
        d = x - y
        n, wins, ties = len(d), int((d > 0).sum()), int((d == 0).sum())
        low = clopper_pearson(wins, n, confidence)[0]
        high = clopper_pearson(wins + ties, n, confidence)[1]
        return (wins + 0.5 * ties) / n, low, high
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all values tied: U is defined, its p is not
        u = stats.mannwhitneyu(x, y, method="asymptotic").statistic
    return float(u) / (len(x) * len(y)), math.nan, math.nan


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """Holm-corrected p-values (statsmodels ``multipletests(method='holm')``); NaN stays NaN, out of the family."""
    keep = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    out = [math.nan] * len(pvalues)
    if not keep:
        return out
    from statsmodels.stats.multitest import multipletests

    corrected = multipletests([pvalues[i] for i in keep], alpha=alpha, method="holm")[1]
    for i, p in zip(keep, corrected):
        out[i] = float(p)
    return out


def decide(p: float, tost: float, diff: float, alpha: float = ALPHA, higher_is_better: bool = True) -> str:
    """``better`` | ``worse`` (p < alpha) | ``equivalent`` (else TOST p < alpha) | ``inconclusive``."""
    if p < alpha:
        return "better" if (diff > 0) == higher_is_better else "worse"
    return "equivalent" if tost < alpha else "inconclusive"
