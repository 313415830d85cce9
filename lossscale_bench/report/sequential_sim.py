"""The group-sequential rule of :mod:`.sequential` run on many synthetic comparisons: its error rates measured.

:func:`simulate` draws seeded paired differences ~ N(delta, sd²), applies the rule through
:func:`~.sequential.run_rule` (the code the report runs) with the spending boundaries, or with
:func:`fixed_critical` (a plain t-test and TOST at every look, what the rule replaces), and returns
how often it called the rows different, equivalent or neither, and how many seeds it used.
"""

from __future__ import annotations

from collections.abc import Sequence

from .sequential import DIFFERENT, EQUIVALENT, UNDECIDED, run_rule, t_boundaries

__all__ = ["fixed_critical", "simulate"]


def fixed_critical(sizes: Sequence[int], alpha: float) -> list[float]:
    """One-sided critical values of a fixed-n t-test at every look: what looking again without spending uses."""
    from scipy import stats

    return [float(stats.t.isf(alpha, n - 1)) for n in sizes]


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
) -> dict:
    """Run the rule on ``reps`` synthetic comparisons: paired differences ~ N(``delta``, ``sd``²), seeded.

    ``naive``: a plain paired t-test and TOST at every look at the fixed-n
    level (:func:`fixed_critical`) instead of the spending boundaries.  Returns
    the shares ``different``, ``better`` (Δ̂ > 0), ``worse``, ``equivalent``,
    ``undecided`` (at the last look), and ``seeds`` (the mean number used).
    """
    import numpy as np

    d = np.random.default_rng(seed).normal(delta, sd, size=(reps, maximum))
    if naive:
        cd, ce = fixed_critical(sizes, alpha / 2.0), fixed_critical(sizes, alpha)
    else:
        cd, ce = t_boundaries(sizes, maximum, alpha / 2.0, spending), t_boundaries(sizes, maximum, alpha, spending)
    outcome, used, sign = run_rule(d, sizes, margin, cd, ce)
    diff = outcome == DIFFERENT
    return {
        "different": float(diff.mean()),
        "better": float((diff & (sign > 0)).mean()),
        "worse": float((diff & (sign < 0)).mean()),
        "equivalent": float((outcome == EQUIVALENT).mean()),
        "undecided": float((outcome == UNDECIDED).mean()),
        "seeds": float(used.mean()),
    }
