"""Whether per-seed differences look normal, and the rank tests that do not need them to.  (numpy, scipy.)

The paired t-test, paired TOST and the seed plan's group-sequential looks
(:mod:`.sequential`) keep their stated 5 % only when the per-seed differences
are roughly normal.  A method that is usually as good as the baseline and
occasionally much worse gives skewed differences; a heavy tail (t₃) does less
harm.  This module is the check and the second opinion:

* **the check**: Shapiro–Wilk (``scipy.stats.shapiro``) on the paired
  differences, from :data:`MIN_N` = 3 seeds (fewer: no test exists), at level
  :data:`NORMALITY_ALPHA` = 0.05: a row whose differences give p < 0.05 is
  flagged (:func:`looks_skewed`).  Shapiro–Wilk was chosen over a skewness
  bound because it reacts to a long tail on either side and to an outlier,
  has an exact small-sample null distribution from n = 3, and its level is a
  stated 5 % whatever the spread; it is weak with few seeds (it flagged 8 %
  of 10,000 lognormal-shaped samples of 3 differences, 33 % of 6, 71 % of 12),
  and the guide's simulation table measures what that leaves.
* **the second opinion**: the Wilcoxon signed-rank test of the differences
  (:func:`wilcoxon_p`, two-sided, exact for n <= 50 without ties) for a
  difference, and for equivalence its TOST (:func:`rank_tost_p`: two
  one-sided signed-rank tests of d + m > 0 and d − m < 0, the larger p):
  rank tests assume only a symmetric distribution of the differences around
  their centre under each null, not normality.  They cannot reach 5 % with
  few seeds: the smallest two-sided signed-rank p is 2/2ⁿ (0.0625 at n = 5,
  0.031 at n = 6), the smallest one-sided 1/2ⁿ (0.0625 at n = 4, 0.031 at
  n = 5), so a flagged row says "different" from 6 seeds and "equivalent"
  from 5.

Zero differences are dropped by the signed-rank test (``zero_method='wilcox'``);
p is NaN where no test can be computed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

__all__ = ["MIN_N", "NORMALITY_ALPHA", "held_looks", "looks_skewed", "rank_tost_p", "shapiro_p", "wilcoxon_p"]

#: the level of the Shapiro–Wilk check
NORMALITY_ALPHA = 0.05
#: the fewest differences Shapiro–Wilk can test
MIN_N = 3


def shapiro_p(d: Sequence[float]) -> float:
    """Shapiro–Wilk p of the differences ``d``; NaN below :data:`MIN_N` values or without spread."""
    import numpy as np
    from scipy import stats

    x = np.asarray(d, dtype=float)
    if x.size < MIN_N or not np.ptp(x) > 1e-12 * max(1.0, float(np.max(np.abs(x)))):
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.shapiro(x).pvalue)


def looks_skewed(d: Sequence[float], level: float = NORMALITY_ALPHA) -> bool:
    """Whether Shapiro–Wilk rejects normality of ``d`` at ``level`` (False where it cannot run)."""
    p = shapiro_p(d)
    return not math.isnan(p) and p < level


def _signed_rank(d, alternative: str) -> float:
    import numpy as np
    from scipy import stats

    x = np.asarray(d, dtype=float)
    if not np.any(x != 0):
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.wilcoxon(x, zero_method="wilcox", alternative=alternative).pvalue)


def wilcoxon_p(d: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p that the differences ``d`` are centred on 0."""
    return _signed_rank(d, "two-sided")


def rank_tost_p(d: Sequence[float], margin: float) -> float:
    """Equivalence within ±``margin`` by two one-sided signed-rank tests: the larger of the p-values of
    "d + margin is centred above 0" and "d − margin is centred below 0"."""
    import numpy as np

    x = np.asarray(d, dtype=float)
    lo, hi = _signed_rank(x + margin, "greater"), _signed_rank(x - margin, "less")
    return max(lo, hi) if not (math.isnan(lo) or math.isnan(hi)) else math.nan


def held_looks(diffs, sizes: Sequence[int], level: float = NORMALITY_ALPHA):
    """(comparisons × looks) booleans: whether the differences up to each look are flagged (:func:`looks_skewed`).

    ``diffs``: comparisons × at least max(sizes), seed by seed.  The seed plan takes no decision at a
    flagged look (:mod:`.seed_looks`); the simulation (:mod:`.sequential_sim`) uses this to apply the same.
    """
    import numpy as np
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    out = np.zeros((d.shape[0], len(sizes)), dtype=bool)
    for k, n in enumerate(sizes):
        if n < MIN_N:
            continue
        x = d[:, :n]
        spread = np.ptp(x, axis=1) > 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = stats.shapiro(x, axis=1).pvalue
        out[:, k] = spread & (np.asarray(p) < level)
    return out
