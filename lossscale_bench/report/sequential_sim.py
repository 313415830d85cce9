"""The group-sequential rule of :mod:`.sequential` run on many synthetic comparisons: its error rates measured.

:func:`simulate` draws seeded paired differences of mean ``delta`` and standard deviation ``sd``
(:func:`draw`: normal, heavy-tailed t₃, or lognormal-shaped: usually close, occasionally much worse),
applies the rule through :func:`~.sequential.run_rule` (the code the report runs) with the spending
boundaries, or with :func:`fixed_critical` (a plain t-test and TOST at every look, what the rule
replaces), with or without the normality check (:func:`.normality.held_looks`: no decision at a look
whose differences look skewed), and returns how often it called the rows different, equivalent or
neither, and how many seeds it used.  :func:`simulate_fixed` does the same for the fixed-n paired
verdict of the tables (:func:`.verdicts.paired_verdict`'s rule: t-test and TOST, or with the check
a flagged row's verdict only where the rank test agrees).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .sequential import DIFFERENT, EQUIVALENT, UNDECIDED, run_rule, t_boundaries

__all__ = ["SHAPES", "draw", "fixed_critical", "simulate", "simulate_fixed"]

#: the shapes :func:`draw` knows
SHAPES = ("normal", "t3", "lognormal")
#: sigma of the log of the lognormal shape (skewness about −6: a method now and then far worse)
_LOG_SIGMA = 1.0


def draw(delta: float, sd: float, size, shape: str = "normal", seed: int = 0):
    """Seeded paired differences of mean ``delta`` and standard deviation ``sd`` in the ``shape``.

    ``normal``; ``t3``: Student's t on 3 degrees of freedom scaled to ``sd`` (heavy tails, symmetric);
    ``lognormal``: ``delta − sd·(L − E L)/sd(L)`` with log L ~ N(0, 1): most seeds a little better
    than the mean, a few much worse (skewness −6.2).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    if shape == "normal":
        return rng.normal(delta, sd, size=size)
    if shape == "t3":
        return delta + sd * rng.standard_t(3, size=size) / math.sqrt(3.0)
    if shape == "lognormal":
        s2 = _LOG_SIGMA**2
        mean, spread = math.exp(s2 / 2.0), math.sqrt((math.exp(s2) - 1.0) * math.exp(s2))
        return delta - sd * (np.exp(_LOG_SIGMA * rng.standard_normal(size)) - mean) / spread
    raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")


def fixed_critical(sizes: Sequence[int], alpha: float) -> list[float]:
    """One-sided critical values of a fixed-n t-test at every look: what looking again without spending uses."""
    from scipy import stats

    return [float(stats.t.isf(alpha, n - 1)) for n in sizes]


def _shares(outcome, used, sign) -> dict:
    diff = outcome == DIFFERENT
    return {
        "different": float(diff.mean()),
        "better": float((diff & (sign > 0)).mean()),
        "worse": float((diff & (sign < 0)).mean()),
        "equivalent": float((outcome == EQUIVALENT).mean()),
        "undecided": float((outcome == UNDECIDED).mean()),
        "seeds": float(used.mean()),
    }


def simulate(
    delta: float,
    sd: float,
    *,
    sizes: Sequence[int],
    maximum: int,
    margin: float = 1.0,
    reps: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    spending: str = "obf",
    naive: bool = False,
    shape: str = "normal",
    check: bool = False,
) -> dict:
    """Run the rule on ``reps`` synthetic comparisons (:func:`draw` in ``shape``), seeded.

    ``naive``: a plain paired t-test and TOST at every look at the fixed-n
    level (:func:`fixed_critical`) instead of the spending boundaries.
    ``check``: no decision at a look whose differences Shapiro–Wilk flags (as
    the seed plan does).  Returns the shares ``different``, ``better`` (Δ̂ > 0),
    ``worse``, ``equivalent``, ``undecided`` (at the last look), ``seeds``
    (the mean number used), and ``fixed_n_different``: the share the tables'
    fixed-n paired t-test calls different on the seeds the rule gathered
    (what the ``vs baseline`` column shows under a plan).
    """
    d = draw(delta, sd, (reps, maximum), shape, seed)
    if naive:
        cd, ce = fixed_critical(sizes, alpha / 2.0), fixed_critical(sizes, alpha)
    else:
        cd, ce = t_boundaries(sizes, maximum, alpha / 2.0, spending), t_boundaries(sizes, maximum, alpha, spending)
    held = None
    if check:
        from .normality import held_looks

        held = held_looks(d, sizes)
    outcome, used, sign = run_rule(d, sizes, margin, cd, ce, held=held)
    return {**_shares(outcome, used, sign), "fixed_n_different": _fixed_on(d, used, alpha)}


def _fixed_on(d, used, alpha: float) -> float:
    """The share the tables' fixed-n paired t-test calls different on the seeds the rule gathered."""
    import numpy as np
    from scipy import stats

    mask = np.arange(d.shape[1])[None, :] < used[:, None]
    x = np.where(mask, d, 0.0)
    mean = x.sum(axis=1) / used
    var = (np.where(mask, (d - mean[:, None]) ** 2, 0.0)).sum(axis=1) / (used - 1)
    t = np.abs(mean) / np.sqrt(var / used)
    return float((t >= stats.t.isf(alpha / 2.0, used - 1)).mean())


def simulate_fixed(
    delta: float,
    sd: float,
    n: int,
    *,
    margin: float = 1.0,
    reps: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    shape: str = "normal",
    check: bool = False,
) -> dict:
    """The tables' fixed-n paired verdict on ``reps`` comparisons of ``n`` seeds: the shares as :func:`simulate`.

    Without ``check``: the paired t-test (different at p < alpha) and TOST (equivalent); with it, a
    comparison whose differences Shapiro–Wilk flags keeps its verdict only where the Wilcoxon
    signed-rank test (a difference) or the rank TOST (equivalence) agrees (:mod:`.normality`), as
    the report does.
    """
    import numpy as np

    from .normality import held_looks, rank_tost_p, wilcoxon_p

    d = draw(delta, sd, (reps, n), shape, seed)
    cd, ce = fixed_critical([n], alpha / 2.0), fixed_critical([n], alpha)
    outcome, used, sign = run_rule(d, [n], margin, cd, ce)
    if check:
        flagged = held_looks(d, [n])[:, 0]
        inside = run_rule(d, [n], margin, [math.inf], ce)[0] == EQUIVALENT  # TOST alone
        for i in np.flatnonzero(flagged):  # a verdict needs the rank test too (the larger p decides)
            if outcome[i] == DIFFERENT and wilcoxon_p(d[i]) < alpha:
                continue
            outcome[i] = EQUIVALENT if inside[i] and rank_tost_p(d[i], margin) < alpha else UNDECIDED
    return _shares(outcome, used, sign)
