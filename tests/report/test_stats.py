"""report/stats.py: the t-tests, TOST, resolving power, P(>), Holm, against scipy and hand-worked numbers.

Values are mAP fractions as the store holds them; the comments work in points (×100). The expected
numbers are written out by hand (or with scipy's t distribution, never with the code under test), so a
change in what a verdict means shows here.
"""

from __future__ import annotations

import math
import statistics
import warnings

import pytest

from lossscale_bench import report
from lossscale_bench.report.stats import (
    clopper_pearson,
    decide,
    format_margin,
    format_p,
    holm,
    prob_better,
    seeds_needed,
    tost_p,
)
from lossscale_bench.report.verdicts import compare_cells, noise_verdict, paired_verdict

M = 0.01  # the default margin, 1.0 mAP point, in the stored unit
BASE_VALS, BAD_VALS, OK_VALS = [0.50, 0.51, 0.49], [0.10, 0.12, 0.11], [0.505, 0.49, 0.51]

# Seed values (points) of the CLI test's study (test_compare.py RANKED): FP32 44, 46, 42.
FP32 = {0: 0.440, 1: 0.460, 2: 0.420}
# ×128: 44.3, 46.1, 42.5. Per-seed differences 0.3, 0.1, 0.5: mean 0.3, sd 0.2, se 0.2/√3 = 0.11547.
#   t-test: t = 2.598 on 2 df, p = 0.12: no difference shown.
#   TOST at ±1.0: lower test t = (0.3 + 1)/0.11547 = 11.26, p = t.sf(11.26, 2) = 0.0039;
#   upper test t = (0.3 − 1)/0.11547 = −6.06, p = t.cdf(−6.06, 2) = 0.0131; TOST p = max = 0.013 < 0.05:
#   equivalent. 95% half-width 4.303 · 0.11547 = 0.497 (so 3 seeds reach ±1.0: at 2, 12.71 · 0.2/√2 = 1.80).
X128 = {0: 0.443, 1: 0.461, 2: 0.425}
# adaptive: 45.5, 44.0, 43.0. Differences 1.5, −2.0, 1.0: mean 0.1667, sd 1.893, se 1.0929.
#   t-test p = 0.89. TOST: (0.1667 + 1)/1.0929 = 1.068, p = 0.199; (0.1667 − 1)/1.0929 = −0.762, p = 0.263:
#   TOST p = 0.263: inconclusive. Seeds for a ±1.0 half-width: t(0.975, n−1) · 1.893/√n is 1.0087 at n = 16
#   (t = 2.131) and 0.9733 at n = 17 (t = 2.120): ~17. Ahead of FP32 on seeds 0 and 2: P(>) = 2/3.
ADAPTIVE = {0: 0.455, 1: 0.440, 2: 0.430}


def _pts(d):
    return {k: v * 100 for k, v in d.items()}


def test_tost_says_equivalent_within_the_margin():
    from scipy import stats

    v = paired_verdict(X128, FP32, margin=M, shown_scale=100)
    # independently: the two one-sided p-values from scipy's t distribution on the per-seed differences
    d = [_pts(X128)[k] - _pts(FP32)[k] for k in range(3)]
    se = statistics.stdev(d) / math.sqrt(3)
    by_hand = max(stats.t.sf((statistics.mean(d) + 1.0) / se, 2), stats.t.cdf((statistics.mean(d) - 1.0) / se, 2))
    assert by_hand == pytest.approx(0.01307, abs=1e-5)
    assert v["tost_p"] == pytest.approx(by_hand, rel=1e-9)
    assert v["p_value"] == pytest.approx(0.1217, abs=1e-4) and v["outcome"] == "equivalent"
    assert v["verdict"] == "equivalent (±1.0, paired TOST p=0.013)"
    assert v["half_width"] == pytest.approx(0.004968, abs=1e-6) and v["seeds_needed"] == 3
    # ahead on every seed: 3 wins in 3, whose exact interval is [0.025^(1/3), 1] = [0.292, 1], not [1, 1]
    assert (v["p_better"], v["p_better_high"]) == (1.0, 1.0)
    assert v["p_better_low"] == pytest.approx(0.025 ** (1 / 3)) == pytest.approx(0.2924, abs=1e-4)
    # the 90% interval TOST decided on: 0.3 ± t(0.95, 2) · 0.11547 = 0.3 ± 2.920 · 0.11547 = [-0.037, +0.637],
    # inside ±1.0, while the 95% one, 0.3 ± 0.497, is the wider [-0.197, +0.797]
    assert (v["tost_ci_low"] * 100, v["tost_ci_high"] * 100) == (
        pytest.approx(-0.0372, abs=1e-3),
        pytest.approx(0.6372, abs=1e-3),
    )
    assert v["margin"] == M
    # a tighter margin is not shown: the 90% interval 0.3 ± 2.920 · 0.11547 = [-0.04, +0.64] leaves ±0.5
    tight = paired_verdict(X128, FP32, margin=0.005, shown_scale=100)
    assert tight["outcome"] == "inconclusive" and tight["verdict"] == "inconclusive (paired, p=0.12)"
    assert tight["p_value"] == v["p_value"]  # the margin changes the equivalence test only


def test_tost_says_inconclusive_and_how_many_seeds_it_would_take():
    from scipy import stats

    v = paired_verdict(ADAPTIVE, FP32, margin=M, shown_scale=100)
    d = [_pts(ADAPTIVE)[k] - _pts(FP32)[k] for k in range(3)]
    se = statistics.stdev(d) / math.sqrt(3)
    by_hand = max(stats.t.sf((statistics.mean(d) + 1.0) / se, 2), stats.t.cdf((statistics.mean(d) - 1.0) / se, 2))
    assert by_hand == pytest.approx(0.2627, abs=1e-4) and v["tost_p"] == pytest.approx(by_hand, rel=1e-9)
    assert v["outcome"] == "inconclusive" and v["verdict"] == "inconclusive (paired, p=0.89)"
    assert v["seeds_needed"] == 17
    assert v["half_width"] == pytest.approx(0.04702, abs=1e-5)  # 4.303 · 1.0929 points
    assert v["p_better"] == pytest.approx(2 / 3)
    # 2 wins in 3: Clopper-Pearson [Beta(0.025; 2, 2), Beta(0.975; 3, 1)] = [0.0943, 0.9916]
    assert (v["p_better_low"], v["p_better_high"]) == (
        pytest.approx(0.09430, abs=1e-4),
        pytest.approx(0.99160, abs=1e-4),
    )


def test_clopper_pearson_by_hand_and_against_statsmodels_and_scipy():
    """The exact binomial interval: k = 0 and k = n in closed form, the rest against two libraries."""
    from scipy import stats
    from statsmodels.stats.proportion import proportion_confint

    # 0 in n: [0, 1 − (alpha/2)^(1/n)]; n in n: [(alpha/2)^(1/n), 1]. 0/3 = [0, 0.708], 3/3 = [0.292, 1]
    lo, hi = clopper_pearson(0, 3)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 3)) == pytest.approx(0.7076, abs=1e-4)
    lo, hi = clopper_pearson(3, 3)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 3)) == pytest.approx(0.2924, abs=1e-4)
    # 1 in 2 (by hand: [1 − √0.975, √0.975] = [0.0126, 0.9874])
    lo, hi = clopper_pearson(1, 2)
    assert (lo, hi) == (pytest.approx(1 - math.sqrt(0.975)), pytest.approx(math.sqrt(0.975)))
    for k, n in ((0, 1), (1, 1), (0, 2), (1, 3), (2, 3), (4, 10), (7, 12), (12, 12)):
        got = clopper_pearson(k, n)
        assert got == pytest.approx(proportion_confint(k, n, alpha=0.05, method="beta"), abs=1e-12)
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert got == pytest.approx((ci.low, ci.high), abs=1e-12)
        assert got[1] - got[0] > 0.2  # a dozen seeds at most: never a zero-width interval
    with pytest.raises(ValueError):
        clopper_pearson(4, 3)


def test_p_better_intervals_never_claim_certainty_from_a_few_seeds():
    # behind on every one of 3 seeds: P(>) = 0 with [0, 0.708], not [0, 0] (the bootstrap's)
    p, lo, hi = prob_better([0.1, 0.2, 0.3], [0.5, 0.6, 0.7], paired=True)
    assert (p, lo) == (0.0, 0.0) and hi == pytest.approx(0.7076, abs=1e-4)
    # a tie could go either way: 1 win, 1 tie, 1 loss: low end of 1/3, high end of 2/3
    p, lo, hi = prob_better([0.5, 0.6, 0.7], [0.5, 0.5, 0.8], paired=True)
    assert p == 0.5 and (lo, hi) == (clopper_pearson(1, 3)[0], clopper_pearson(2, 3)[1])
    # unpaired: U/(n·m) without an interval (no exact one exists; a bootstrap over 3 values says [1, 1])
    p, lo, hi = prob_better([0.6, 0.7, 0.8], [0.1, 0.2, 0.3], paired=False)
    assert p == 1.0 and math.isnan(lo) and math.isnan(hi)


def test_welch_tost_is_the_larger_of_two_one_sided_welch_tests():
    from scipy import stats

    a, b = [0.443, 0.452, 0.437, 0.449], [0.440, 0.460, 0.420]
    v = noise_verdict(a, b, margin=0.02, shown_scale=100)
    va, vb = statistics.variance(a) / 4, statistics.variance(b) / 3
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 2)  # Welch–Satterthwaite
    d = statistics.mean(a) - statistics.mean(b)
    by_hand = max(stats.t.sf((d + 0.02) / se, df), stats.t.cdf((d - 0.02) / se, df))
    assert v["test"] == "welch" and v["tost_p"] == pytest.approx(by_hand, rel=1e-9)
    assert v["df"] == pytest.approx(df) and v["half_width"] == pytest.approx(stats.t.ppf(0.975, df) * se)
    assert tost_p(a, b, 0.02, paired=False) == pytest.approx(by_hand, rel=1e-9)


def test_seeds_needed_by_hand():
    # paired, sd 2 points, margin 1: t(0.975, n-1)·2/√n <= 1 first at n = 18 (2.110·2/4.243 = 0.995; n = 17:
    # 2.120·2/4.123 = 1.028)
    assert seeds_needed(1.0, var_diff=4.0) == 18
    # Welch, sd 3.54 and 1.00 (variances 12.5 and 1): with equal n the df is 13.5²(n−1)/(12.5² + 1²);
    # at n = 54 df = 61.4, t = 1.9993, 1.9993·√(13.5/54) = 0.9997 <= 1; at n = 53: 2.0001·√(13.5/53) = 1.009
    assert seeds_needed(1.0, var_a=12.5, var_b=1.0) == 54
    # already narrow: the least n that has an interval at all
    assert seeds_needed(1.0, var_diff=1e-6) == 2
    # past MAX_SEEDS: infinite, not a loop
    assert math.isinf(seeds_needed(1e-6, var_diff=1.0))
    # margins whose square under- or overflows: no ZeroDivisionError or OverflowError
    assert math.isinf(seeds_needed(1e-302, var_diff=1e-4)) and seeds_needed(1e306, var_diff=1e-4) == 2


def test_p_better_counts_ties_as_one_half():
    from scipy import stats

    # paired: seed 0 tied (1/2), seed 1 ahead (1), seed 2 behind (0): 1.5/3
    assert prob_better([0.5, 0.6, 0.7], [0.5, 0.5, 0.8], paired=True)[0] == 0.5
    # unpaired: 1 beats (0); 2 ties both 2s and beats 0 (2); 3 beats all (3): U = 6 of 9 pairs
    x, y = [1.0, 2.0, 3.0], [2.0, 2.0, 0.0]
    p, lo, hi = prob_better(x, y, paired=False)
    assert p == pytest.approx(6 / 9) == stats.mannwhitneyu(x, y).statistic / 9
    assert math.isnan(lo) and math.isnan(hi)
    # lower is better (a loss): the same values read the other way
    assert prob_better(x, y, paired=False, higher_is_better=False)[0] == pytest.approx(3 / 9)
    # ahead on every seed: 3 in 3, [0.292, 1]
    assert prob_better([0.6, 0.7, 0.8], [0.5, 0.5, 0.5], paired=True) == (1.0, pytest.approx(0.2924, abs=1e-4), 1.0)


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 -> ×3, ×2, ×1 = 0.03, 0.06, 0.04 -> running maximum 0.03, 0.06, 0.06
    got = holm([0.01, math.nan, 0.04, 0.03])
    assert got[0] == pytest.approx(0.03) and math.isnan(got[1])
    assert got[2] == pytest.approx(0.06) and got[3] == pytest.approx(0.06)
    assert holm([0.6, 0.9]) == [1.0, 1.0]  # 2·0.6 capped at 1, and 0.9 raised to the running maximum
    assert holm([0.02, 0.9]) == [pytest.approx(0.04), 0.9]
    assert holm([]) == [] and all(math.isnan(p) for p in holm([math.nan]))


def test_decide_and_wording():
    assert decide(0.01, 0.5, -0.02) == "worse" and decide(0.01, 0.5, 0.02) == "better"
    assert decide(0.01, 0.5, 0.02, higher_is_better=False) == "worse"
    assert decide(0.2, 0.01, 0.0) == "equivalent" and decide(0.2, 0.3, 0.0) == "inconclusive"
    # a significant difference inside the margin is still a difference
    assert decide(0.01, 0.01, 0.003) == "better"
    assert format_margin(1.0) == "1.0" and format_margin(0.5) == "0.5" and format_margin(0.25) == "0.25"
    assert format_margin(2) == "2.0"
    with pytest.raises(ValueError, match="margin"):
        paired_verdict(X128, FP32, margin=0.0)
    with pytest.raises(ValueError, match="margin"):
        noise_verdict([0.1, 0.2], [0.1, 0.3], margin=math.nan)


def test_compare_cells_pairs_only_whole_matching_seeds():
    same = compare_cells(list(X128.values()), X128, list(FP32.values()), FP32, margin=M)
    assert same["test"] == "paired"
    other = {3: 0.443, 4: 0.461, 5: 0.425}  # the same values on other seeds: nothing to pair
    assert compare_cells(list(other.values()), other, list(FP32.values()), FP32, margin=M)["test"] == "welch"
    # a value without a seed (4 values, 3 seeds): not whole, Welch
    assert compare_cells([*X128.values(), 0.45], X128, list(FP32.values()), FP32, margin=M)["test"] == "welch"


def test_noise_verdict_matches_scipy():
    from scipy import stats

    v = report.noise_verdict(BAD_VALS, BASE_VALS, margin=M)
    ref = stats.ttest_ind(BAD_VALS, BASE_VALS, equal_var=False)
    assert v["p_value"] == pytest.approx(ref.pvalue, rel=1e-12) and v["t"] == pytest.approx(ref.statistic)
    assert v["outcome"] == "worse" and v["verdict"] == "worse than baseline (p<0.001)"
    # CI: Welch–Satterthwaite df and t.ppf, the same interval scipy's own result gives
    ci = ref.confidence_interval(0.95)
    assert (v["diff_ci_low"], v["diff_ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert v["df"] == pytest.approx(ref.df)
    ok = report.noise_verdict(OK_VALS, BASE_VALS, margin=M)
    assert ok["outcome"] == "inconclusive" and ok["verdict"].startswith("inconclusive (p=0.")
    assert report.noise_verdict(BASE_VALS, BAD_VALS, margin=M)["outcome"] == "better"
    # lower is better (a loss): the same difference reads the other way
    assert report.noise_verdict(BAD_VALS, BASE_VALS, margin=M, higher_is_better=False)["outcome"] == "better"
    assert report.noise_verdict([0.5], BASE_VALS, margin=M)["verdict"] == "too few seeds"
    assert report.noise_verdict(BASE_VALS, [0.5], margin=M)["verdict"] == "too few seeds"
    assert report.noise_verdict([], BASE_VALS, margin=M)["verdict"] == "no values"
    flat = report.noise_verdict([0.5, 0.5], [0.4, 0.4], margin=M)  # scipy would divide by zero
    assert flat["outcome"] == "no variance" and math.isnan(flat["p_value"]) and flat["diff"] == pytest.approx(0.1)
    assert math.isnan(flat["tost_p"]) and math.isnan(flat["p_better"]) and math.isnan(flat["seeds_needed"])


def test_paired_verdict_matches_scipy():
    from scipy import stats

    base = {0: 0.50, 1: 0.52, 2: 0.48}
    row = {0: 0.489, 1: 0.511, 2: 0.470}  # each seed 0.9-1.1 points under its baseline seed; seeds spread 2 points
    x, y = [row[k] for k in (0, 1, 2)], [base[k] for k in (0, 1, 2)]
    ref = stats.ttest_rel(x, y)
    v = paired_verdict(row, base, margin=M)
    assert v["test"] == "paired" and v["n"] == v["n_baseline"] == 3 and v["df"] == 2
    assert v["p_value"] == pytest.approx(ref.pvalue, rel=1e-9) and v["t"] == pytest.approx(ref.statistic, rel=1e-9)
    ci = ref.confidence_interval(0.95)
    assert (v["diff_ci_low"], v["diff_ci_high"]) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))
    assert v["diff"] == pytest.approx(statistics.mean(x) - statistics.mean(y))
    assert v["mean"] == pytest.approx(statistics.mean(x)) and v["mean_baseline"] == pytest.approx(0.50)
    # the same numbers unpaired: Welch cannot tell, the pairs show a consistent loss
    welch = report.noise_verdict(x, y, margin=M)
    assert welch["outcome"] == "inconclusive" and welch["p_value"] > 0.05 and "paired" not in welch["verdict"]
    assert v["outcome"] == "worse" and ref.pvalue < 0.05
    assert v["verdict"] == f"worse than baseline (paired, {format_p(ref.pvalue)})"
    # either dict order; a seed only one side has is left out; lower-is-better reads the sign the other way
    assert paired_verdict(dict(reversed(row.items())), {**base, 7: 0.1}, margin=M)["p_value"] == pytest.approx(
        ref.pvalue
    )
    assert paired_verdict(row, base, margin=M, higher_is_better=False)["outcome"] == "better"
    assert paired_verdict(base, row, margin=M)["outcome"] == "better"
    # alpha: the same p is no difference at a stricter level (and not equivalent: Δ ≈ −1.0 point)
    assert paired_verdict(row, base, margin=M, alpha=ref.pvalue / 2)["outcome"] == "inconclusive"

    noisy = paired_verdict({0: 0.505, 1: 0.49, 2: 0.51}, {0: 0.50, 1: 0.51, 2: 0.49}, margin=M)
    ref = stats.ttest_rel([0.505, 0.49, 0.51], [0.50, 0.51, 0.49])
    assert noisy["outcome"] == "inconclusive" and noisy["verdict"] == f"inconclusive (paired, {format_p(ref.pvalue)})"
    assert noisy["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)

    # one seed in common (0): nothing to estimate a spread from
    few = paired_verdict({0: 0.45, 1: 0.46}, {0: 0.50, 2: 0.49}, margin=M)
    assert few["verdict"] == "too few seeds" and few["outcome"] == "too few" and few["n"] == 1
    assert math.isnan(few["p_value"]) and few["diff"] == pytest.approx(-0.05)

    # identical differences: no spread to test against (scipy: t = inf, p = 0)
    flat = paired_verdict({0: 0.33, 1: 0.34}, {0: 0.30, 1: 0.31}, margin=M)
    assert flat["verdict"] == "no seed variance" and flat["outcome"] == "no variance"
    assert math.isnan(flat["p_value"]) and math.isnan(flat["diff_ci_low"]) and flat["diff"] == pytest.approx(0.03)
    # equal up to float rounding (0.33-0.30 != 0.42-0.39 in binary): scipy finds p ~ 6e-16 in the residue,
    # which would read "better than baseline (p<0.001)"; the report says there is no spread
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy: "catastrophic cancellation"
        assert 0.33 - 0.30 != 0.42 - 0.39 and stats.ttest_rel([0.33, 0.42], [0.30, 0.39]).pvalue < 1e-12
    residue = paired_verdict({0: 0.33, 1: 0.42}, {0: 0.30, 1: 0.39}, margin=M)
    assert residue["verdict"] == "no seed variance" and math.isnan(residue["p_value"])
    # but a real, tiny spread of the differences is tested
    tiny = paired_verdict({0: 0.33, 1: 0.3401}, {0: 0.30, 1: 0.31}, margin=M)
    assert tiny["outcome"] != "no variance"
    assert tiny["p_value"] == pytest.approx(stats.ttest_rel([0.33, 0.3401], [0.30, 0.31]).pvalue, rel=1e-9)


def test_p_value_text_never_contradicts_the_verdict():
    assert format_p(0.003) == "p=0.003" and format_p(0.42) == "p=0.42" and format_p(0.01) == "p=0.01"
    assert format_p(0.0496) == "p=0.0496"  # two digits would print 0.05 next to "worse"
    assert format_p(0.0004) == "p<0.001" and format_p(1.0) == "p=1"
