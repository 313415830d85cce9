"""Adding seeds until a comparison is decided: a group-sequential paired t-test and TOST.  (numpy, scipy.)

A fixed number of seeds either wastes trials on comparisons already decided or
stops before the close ones are.  Looking at a plain t-test after every round
of seeds and stopping when it says "different" (or TOST says "equivalent")
raises the chance of a false verdict well above the stated 5 %: every look is
another chance for noise to cross the line.  A group-sequential test spends
the 5 % over the looks instead, so that the chance of *ever* crossing, over all
the planned looks, stays at 5 %.

The rule, per comparison of two rows on paired seed differences d (row − other):

* **looks** at n = start, start + step, ... seeds, the last at ``maximum``
  (:func:`look_sizes`); the information fraction of a look is n / maximum.
* **boundaries** from Lan–DeMets alpha spending (Lan & DeMets 1983), by default
  the O'Brien–Fleming-type function α(t) = 2 − 2Φ(z₁₋α/₂ / √t) (``"obf"``:
  almost nothing spent at the first looks, close to the fixed-n test at the
  last), or the Pocock-type α·ln(1 + (e − 1)t) (``"pocock"``).  The z-scale
  boundaries are computed by the recursive numerical integration of Armitage,
  McPherson & Rowe (1969) (Jennison & Turnbull 2000, ch. 19) in
  :func:`z_boundaries`.
* **unknown variance, few seeds**: the boundaries are applied to Student's t
  statistic of the paired differences.  The first look's is exact (t on
  n − 1 degrees of freedom at the level spent there); each later one is set
  on the t scale by simulation (:func:`t_boundaries`): under Δ = 0 the
  sequence of paired t statistics does not depend on σ (nor, at |Δ| =
  margin, that of the TOST statistic that decides a false equivalence), so
  seeded standard normal paths give the value each look must reach for the
  spending to hold, for every spread.  Carrying the z boundaries to t at the
  same nominal level (Jennison & Turnbull 2000, §11.3) is not enough with
  3 seeds at the first look: it lets the false-difference rate reach 0.053
  (looks at 3, 6, ..., 18 seeds; 10⁶ simulated comparisons), so it is used
  only where a look spends too little to simulate.
  tests/report/test_sequential.py and benchmarks/sequential_rates.py
  measure the rates from n = 3.
* **different** (better/worse) at the first look where |t| reaches the
  two-sided boundary (spending alpha/2 on each side); **equivalent** within
  ±margin where both one-sided tests of TOST reach the one-sided boundary
  (spending alpha: the ``1 − 2·alpha_k`` interval at that look lies inside
  ±margin).  Different wins when both hold at one look (as :func:`.stats.decide`).
  Stopping at one kind of decision can only lower the chance of the other, so
  each error rate stays at most alpha.
* **not equivalent and not different at max** when the last look decides
  neither.

Many pairs at once: :func:`sequential_p` is the smallest alpha at which the
difference boundaries would have been crossed by the current look (a repeated
p-value, valid at every look); Holm over those p-values (:func:`.stats.holm`)
decides the pairs of a table as the fixed-n report does.

:func:`run_rule` applies any set of per-look critical values to many simulated
studies at once (the rule above, or :func:`.sequential_sim.fixed_critical`: a
plain t-test and TOST at every look, what the rule replaces), so the simulation
(:mod:`.sequential_sim`) proves the code the report runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from functools import lru_cache

__all__ = [
    "CONTINUE",
    "DIFFERENT",
    "EQUIVALENT",
    "SPENDING",
    "UNDECIDED",
    "UNDECIDED_TEXT",
    "look",
    "look_sizes",
    "method_text",
    "run_rule",
    "sequential_p",
    "spent",
    "t_boundaries",
    "z_boundaries",
]

#: the spending functions :func:`spent` knows
SPENDING = ("obf", "pocock")
#: run_rule's codes: the outcome of one simulated comparison
DIFFERENT, EQUIVALENT, CONTINUE, UNDECIDED = 1, 2, 0, 3
#: what a comparison undecided at the last look is called
UNDECIDED_TEXT = "not equivalent and not different at max"

#: null paths that set the t-scale boundaries (each used with both signs) and the RNG seed that draws them
_NULL_PATHS = 200_000
_NULL_SEED = 20_830_401
_CHUNK = 20_000
#: a look that spends fewer crossing paths than this takes the nominal-level boundary
_MIN_EVENTS = 40
#: sequential_p reads smaller p-values as this
_P_FLOOR = 1e-6
#: grid of the numerical integration: points per unit of standard deviation, and how far the lower tail goes
_GRID_PER_SD = 40
_TAIL_SD = 9.0


def method_text(spending: str = "obf") -> str:
    """One line for a report saying how the looks were judged, with the citations."""
    name = {"obf": "O'Brien-Fleming type", "pocock": "Pocock type"}[spending]
    return (
        f"group-sequential paired t-test and TOST (Jennison & Turnbull 2000), Lan-DeMets alpha spending "
        f"({name}; Lan & DeMets 1983), t-scale boundaries set by a seeded null simulation, Holm over pairs"
    )


def look_sizes(start: int, step: int, maximum: int) -> list[int]:
    """The numbers of seeds at which a comparison is looked at: start, start + step, ..., maximum.

    The last look is at ``maximum`` even where the steps do not land on it
    (3, 5, 12 gives 3, 8, 12).  ``start`` must be at least 2 (a spread needs two seeds).
    """
    if not (2 <= start <= maximum and step >= 1):
        raise ValueError(f"need 2 <= start <= maximum and step >= 1, got start={start}, step={step}, maximum={maximum}")
    sizes = list(range(start, maximum + 1, step))
    if sizes[-1] != maximum:
        sizes.append(maximum)
    return sizes


def spent(t: float, alpha: float, spending: str = "obf") -> float:
    """Alpha spent by information fraction ``t`` (0 < t <= 1): Lan–DeMets spending functions.

    ``obf``: 2 − 2Φ(Φ⁻¹(1 − alpha/2)/√t) (O'Brien–Fleming type); ``pocock``:
    alpha·ln(1 + (e − 1)·t).  Both spend exactly ``alpha`` at t = 1.
    """
    from scipy import special

    t = min(max(t, 0.0), 1.0)
    if t == 0.0:
        return 0.0
    if spending == "obf":
        return float(2.0 * special.ndtr(special.ndtri(alpha / 2.0) / math.sqrt(t)))
    if spending == "pocock":
        return alpha * math.log(1.0 + (math.e - 1.0) * t)
    raise ValueError(f"spending must be one of {', '.join(SPENDING)}, got {spending!r}")


@lru_cache(maxsize=256)
def _z_boundaries(fractions: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    import numpy as np
    from scipy import optimize, special

    def pdf(x):
        return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)

    out: list[float] = []
    grid = weights = dens = None  # the sub-density of S_{k-1} on the continuation region
    prev_t = prev_spent = 0.0
    for t in fractions:
        target = spent(t, alpha, spending) - prev_spent
        if grid is None:
            c = float(-special.ndtri(target)) if target > 0 else math.inf
        else:
            sd_inc = math.sqrt(t - prev_t)

            def crossing(c, grid=grid, w=weights * dens, sd_inc=sd_inc, t=t):
                return float(np.dot(w, special.ndtr((grid - c * math.sqrt(t)) / sd_inc)))

            if target <= 0 or crossing(40.0) >= target:
                c = math.inf if target <= 0 else 40.0
            else:
                c = float(optimize.brentq(lambda c, goal=target: crossing(c) - goal, -10.0, 40.0, xtol=1e-10))
        out.append(c)
        # S_k = Z_k·√t_k on its continuation region (S_k < c·√t_k), from the lower tail up
        top = min(c, 12.0) * math.sqrt(t)
        bottom = -_TAIL_SD * math.sqrt(t)
        points = max(int((top - bottom) / math.sqrt(t) * _GRID_PER_SD) | 1, 101)  # odd: Simpson
        new = np.linspace(bottom, top, points)
        if grid is None:
            new_dens = pdf(new / math.sqrt(t)) / math.sqrt(t)
        else:
            sd_inc = math.sqrt(t - prev_t)
            kernel = pdf((new[:, None] - grid[None, :]) / sd_inc) / sd_inc
            new_dens = kernel @ (weights * dens)
        h = new[1] - new[0]
        w = np.ones(points)
        w[1:-1:2], w[2:-1:2] = 4.0, 2.0
        grid, weights, dens = new, w * h / 3.0, new_dens
        prev_t, prev_spent = t, prev_spent + target
    return tuple(out)


def z_boundaries(fractions: Sequence[float], alpha: float, spending: str = "obf") -> list[float]:
    """One-sided z-scale boundaries c_k for looks at information ``fractions`` (increasing, last 1).

    Under the null, P(Z_j < c_j for j < k, Z_k >= c_k) = spent(t_k) − spent(t_{k−1}),
    so the chance of ever crossing is ``alpha``.  Z_k is the standardised sum of
    the first t_k of the observations (Brownian motion at t_k); the crossing
    probabilities come from the sub-density of the unstopped paths on a grid
    (Simpson's rule, Armitage–McPherson–Rowe recursion).  ``inf`` where a look
    spends nothing.
    """
    fr = tuple(float(f) for f in fractions)
    if not fr or any(b <= a for a, b in itertools.pairwise(fr)) or fr[0] <= 0 or fr[-1] > 1:
        raise ValueError(f"information fractions must increase within (0, 1], got {list(fr)}")
    return list(_z_boundaries(fr, float(alpha), spending))


@lru_cache(maxsize=4)
def _null_t(maximum: int):
    """Paired t statistics of seeded standard normal differences after 2, 3, ..., ``maximum`` of them: (paths × n−1).

    Under no difference the sequence of t statistics does not depend on the
    spread, so these paths stand for every study; used with both signs.  One
    draw per ``maximum``: the boundaries of the first looks of a plan are the
    same whichever later looks follow, and the same every time they are computed.
    """
    import numpy as np

    rng = np.random.default_rng(_NULL_SEED)
    n = np.arange(2, maximum + 1)
    out = np.empty((_NULL_PATHS, maximum - 1), dtype=np.float32)  # float32: 80 MB at 100 seeds
    for lo in range(0, _NULL_PATHS, _CHUNK):
        d = rng.standard_normal((min(_CHUNK, _NULL_PATHS - lo), maximum))
        mean = np.cumsum(d, axis=1)[:, 1:] / n
        ss = np.cumsum(d * d, axis=1)[:, 1:] - n * mean * mean
        out[lo : lo + d.shape[0]] = mean / np.sqrt(ss / (n - 1) / n)
    return out


@lru_cache(maxsize=8)
def _null_paths(sizes: tuple[int, ...], maximum: int):
    """The null t statistics at these looks, with both signs, one look a column (contiguous, for speed)."""
    import numpy as np

    half = _null_t(maximum)[:, [n - 2 for n in sizes]]
    return np.asfortranarray(np.concatenate([half, -half]))


@lru_cache(maxsize=1024)
def _t_boundaries(sizes: tuple[int, ...], maximum: int, alpha: float, spending: str) -> tuple[float, ...]:
    import numpy as np
    from scipy import special

    zs = z_boundaries([n / maximum for n in sizes], alpha, spending)
    nominal = [
        float(special.stdtrit(n - 1, special.ndtr(z))) if math.isfinite(z) else math.inf for z, n in zip(zs, sizes)
    ]
    paths = _null_paths(sizes, maximum)
    total = paths.shape[0]
    alive = np.ones(total, dtype=bool)
    out: list[float] = []
    before = 0.0
    for k, n in enumerate(sizes):
        now = spent(n / maximum, alpha, spending)
        share = (now - before) * total
        # one binomial standard error below the share: the simulation's error errs on the safe side
        events = int(share - math.sqrt(share)) if share > 0 else 0
        if k == 0 or events < _MIN_EVENTS:
            c = nominal[k]  # the first look's t is exactly Student's; a tiny spend: its share is too small to miss
        else:
            vals = paths[alive, k]
            # the events-th largest value: crossing at or above it are `events` of the paths
            c = float(np.partition(vals, vals.size - events)[vals.size - events]) if events <= vals.size else -math.inf
        out.append(c)
        alive &= paths[:, k] < c
        before = now
    return tuple(out)


def t_boundaries(sizes: Sequence[int], maximum: int, alpha: float, spending: str = "obf") -> list[float]:
    """One-sided t-scale critical values for looks at ``sizes`` seeds out of ``maximum``, spending ``alpha``.

    The first look's is exact: Student's t on n − 1 degrees of freedom at the
    level spent there.  Each later one is the value that the t statistic of
    the still-running null paths (seeded normal differences)
    reaches with the probability that look spends, less one binomial
    standard error (so the chance of ever crossing is at most ``alpha``
    within the simulation's error, which is about √(alpha/400000) ≈ 4e-4 at
    alpha = 0.05, instead of scattering around it).  Where a look spends less than
    the simulation can resolve (fewer than a few dozen crossing paths), the
    z boundary (:func:`z_boundaries`) carried to t on n − 1 degrees of freedom
    at the same nominal level (the "significance level approach"); that
    approach alone lets the rate drift above alpha with few seeds (0.053 for
    alpha = 0.05 with looks at 3, 6, ..., 18 seeds), which is why the
    simulation sets the rest.
    """
    return list(_t_boundaries(tuple(int(n) for n in sizes), int(maximum), float(alpha), spending))


def run_rule(
    diffs, sizes: Sequence[int], margin: float, crit_diff: Sequence[float], crit_equiv: Sequence[float], held=None
):
    """Apply the stopping rule to many comparisons at once: (outcome codes, seeds used, sign of Δ̂).

    ``diffs``: an array (comparisons × at least max(sizes)) of paired
    differences, seed by seed in training order.  At look k (the first
    ``sizes[k]`` seeds), with mean m, standard error se and t = m/se: different
    when |t| >= ``crit_diff[k]``; equivalent when |m| + ``crit_equiv[k]``·se <=
    ``margin``; the first look that decides stops the comparison.  Returns
    numpy arrays: the outcome (:data:`DIFFERENT`, :data:`EQUIVALENT`,
    :data:`UNDECIDED` after the last look), the seeds used, and the sign of
    the mean difference at the stopping look.  ``held``: (comparisons × looks)
    booleans, looks at which no decision is taken (the differences looked
    skewed: :func:`.normality.held_looks`); a comparison held at the last look
    is undecided.
    """
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    n = np.asarray(sizes)
    s1 = np.cumsum(d, axis=1)[:, n - 1]
    s2 = np.cumsum(d * d, axis=1)[:, n - 1]
    mean = s1 / n
    var = np.maximum(s2 - n * mean * mean, 0.0) / (n - 1)
    se = np.sqrt(var / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, np.abs(mean) / se, np.where(mean != 0, np.inf, 0.0))
    different = t >= np.asarray(crit_diff, dtype=float)
    equivalent = (np.abs(mean) + np.asarray(crit_equiv, dtype=float) * se <= margin) & ~different
    decided = different | equivalent
    if held is not None:
        held = np.asarray(held, dtype=bool)
        different, equivalent, decided = different & ~held, equivalent & ~held, decided & ~held
    first = np.where(decided.any(axis=1), decided.argmax(axis=1), len(n) - 1)
    rows = np.arange(d.shape[0])
    outcome = np.where(different[rows, first], DIFFERENT, np.where(equivalent[rows, first], EQUIVALENT, UNDECIDED))
    return outcome, n[first], np.sign(mean[rows, first])


@lru_cache(maxsize=4096)
def _p_at(t_abs: Sequence[float], sizes: Sequence[int], maximum: int, spending: str) -> float:
    """Smallest two-sided alpha whose boundaries the |t| values at the looks cross (bisection on log alpha)."""

    def crosses(alpha: float) -> bool:
        crit = t_boundaries(sizes, maximum, alpha / 2.0, spending)
        return any(v >= c for v, c in zip(t_abs, crit))

    lo, hi = _P_FLOOR, 1.0
    if crosses(lo):
        return lo
    if not crosses(hi):
        return 1.0
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if crosses(mid) else (mid, hi)
    return hi


def sequential_p(t_abs: Sequence[float], sizes: Sequence[int], maximum: int, spending: str = "obf") -> float:
    """Repeated p-value of the difference test after the looks so far.

    ``t_abs``: the |t| of the paired t-test at each look (``sizes`` seeds), out of
    ``maximum``.  The smallest alpha at which the two-sided group-sequential test
    at that alpha would have stopped for a difference by the last look; its
    chance of being <= alpha under no difference is at most alpha whenever it is
    read, so Holm over several pairs' values keeps the family's rate.
    Resolution: 1 % relative, between 1e-6 (smaller p-values read 1e-6) and 1.
    """
    return _p_at(tuple(float(v) for v in t_abs), tuple(int(n) for n in sizes), int(maximum), spending)


def look(
    diffs: Sequence[float],
    sizes: Sequence[int],
    maximum: int,
    margin: float,
    alpha: float = 0.05,
    spending: str = "obf",
    higher_is_better: bool = True,
) -> dict:
    """The verdict of one comparison after the looks so far (``diffs`` seed by seed, training order).

    ``sizes``: the numbers of seeds at which it was looked at (the last must be
    ``len(diffs)``), out of a planned ``maximum``.  Returns ``outcome``
    (``better``/``worse``/``equivalent``/``continue``/``undecided``), ``looks``
    (how many), ``n``, ``diff`` (mean difference), ``p_seq`` (:func:`sequential_p`),
    and ``verdict`` (words; undecided: :data:`UNDECIDED_TEXT`).  The looks
    before the last are replayed: a comparison decided at an earlier look stays
    decided there, as it would have stopped.
    """
    import numpy as np

    sizes = [int(n) for n in sizes]
    if not sizes or sizes[-1] != len(diffs) or sizes[-1] > maximum:
        raise ValueError(
            f"the last look must be at all {len(diffs)} differences and <= maximum {maximum}, got looks at {sizes}"
        )
    cd = t_boundaries(sizes, maximum, alpha / 2.0, spending)
    ce = t_boundaries(sizes, maximum, alpha, spending)
    outcome, n, sign = run_rule(np.asarray([diffs], dtype=float), sizes, margin, cd, ce)
    code, used = int(outcome[0]), int(n[0])
    k = sizes.index(used)
    if code == UNDECIDED and sizes[-1] < maximum:
        code = CONTINUE
    d = np.asarray(diffs[:used], dtype=float)
    se = d.std(ddof=1) / math.sqrt(used)
    t_abs = [
        abs(float(np.mean(diffs[:m]))) / (float(np.std(diffs[:m], ddof=1)) / math.sqrt(m))
        if np.std(diffs[:m], ddof=1) > 0
        else math.inf
        for m in sizes[: k + 1]
    ]
    word = {
        DIFFERENT: "better" if (sign[0] > 0) == higher_is_better else "worse",
        EQUIVALENT: "equivalent",
        CONTINUE: "continue",
        UNDECIDED: "undecided",
    }[code]
    text = {"continue": f"undecided after {used} seeds, more to come", "undecided": UNDECIDED_TEXT}.get(word, word)
    return {
        "outcome": word,
        "looks": k + 1,
        "n": used,
        "diff": float(d.mean()),
        "se": float(se),
        "p_seq": sequential_p(t_abs, sizes[: k + 1], maximum, spending),
        "verdict": text,
    }
