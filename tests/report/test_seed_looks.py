"""report/seed_looks.py: the verdicts of a study that adds seeds in rounds, replayed from stored values,
and which rows get the next seeds.  Values are mAP fractions as the store holds them (points ×100)."""

from __future__ import annotations

import pandas as pd

from lossscale_bench.report.seed_looks import reached, rows_to_grow, seed_looks

BASE = [0.440, 0.460, 0.420, 0.450, 0.430, 0.455, 0.445, 0.425, 0.435]


def _summary(rows: dict[str, list[float]], baseline: str = "fp32") -> pd.DataFrame:
    out = []
    for k, (label, vals) in enumerate(rows.items()):
        out.append(
            {
                "setting_id": "s",
                "model": "ssd_tiny",
                "batch_size": 8,
                "row": k,
                "label": label,
                "baseline": label == baseline,
                "values_by_seed": dict(enumerate(vals)),
            }
        )
    return pd.DataFrame(out)


def _done(rows: dict[str, list[float]]) -> dict:
    return {("s", "ssd_tiny", 8, k): set(range(len(v))) for k, v in enumerate(rows.values())}


def test_reached_is_the_last_look_whose_seeds_all_ended():
    assert reached({0, 1, 2, 3}, [3, 6, 9]) == 3
    assert reached({0, 1, 3, 4, 5}, [3, 6, 9]) == 0  # seed 2 still missing
    assert reached(set(range(9)), [3, 6, 9]) == 9


def test_a_clear_difference_is_decided_and_its_rows_stop_growing():
    # five points better on every seed, spread about 0.5: decided at the second look (n=6) of 3, 6, 9 (the
    # spread is not two-valued: a two-point sample fails the normality check, which holds the decision)
    offsets = [-1, 0.4, 1, -0.3, 0.6, -0.8]
    rows = {"fp32": BASE[:6], "good": [v + 0.05 + 0.005 * o for v, o in zip(BASE[:6], offsets)]}
    d = seed_looks(_summary(rows), _done(rows), [3, 6, 9], margin=1.0)
    assert len(d) == 1
    r = d.iloc[0]
    assert (r.outcome, r.looks, r.n, r.label_a, r.label_b) == ("better", 2, 6, "good", "fp32")
    assert r.p_holm < 0.05 and "2 looks, n=6" in r.verdict
    assert rows_to_grow(d, _done(rows), [3, 6, 9]) == {}


def test_an_open_pair_grows_both_rows_to_the_next_look_and_the_decided_rows_stay():
    rows = {"fp32": BASE[:3], "noisy": [0.47, 0.43, 0.45], "same": [0.4405, 0.4595, 0.4203]}
    d = seed_looks(_summary(rows), _done(rows), [3, 6, 9], margin=1.0)
    by = dict(zip(d["label_a"], d["outcome"]))
    assert by["noisy"] == "continue"
    # within ±0.05 points on three seeds: equivalent at ±1.0 already at the first look
    assert by["same"] == "equivalent"
    assert rows_to_grow(d, _done(rows), [3, 6, 9]) == {("s", "ssd_tiny", 8, 0): 6, ("s", "ssd_tiny", 8, 1): 6}


def test_decisions_replay_from_the_store_and_raising_max_continues_the_open_pairs():
    # undecided at the last look of a plan that ends at 6 seeds
    noisy = [0.47, 0.41, 0.45, 0.40, 0.46, 0.43, 0.48, 0.41, 0.47]
    rows = {"fp32": BASE[:6], "noisy": noisy[:6]}
    d = seed_looks(_summary(rows), _done(rows), [3, 6], margin=1.0)
    assert d.iloc[0].outcome == "undecided" and "not equivalent and not different at max" in d.iloc[0].verdict
    assert rows_to_grow(d, _done(rows), [3, 6]) == {}
    # max raised to 9: the same stored seeds, replayed against the new plan, leave the pair open
    d9 = seed_looks(_summary(rows), _done(rows), [3, 6, 9], margin=1.0)
    assert d9.iloc[0].outcome == "continue" and d9.iloc[0].looks == 2
    assert rows_to_grow(d9, _done(rows), [3, 6, 9]) == {("s", "ssd_tiny", 8, 0): 9, ("s", "ssd_tiny", 8, 1): 9}
    # the same look twice gives the same decisions (a resumed study decides as the interrupted one)
    pd.testing.assert_frame_equal(d9, seed_looks(_summary(rows), _done(rows), [3, 6, 9], margin=1.0))


def test_a_pair_decided_early_stays_decided_when_its_rows_have_more_seeds():
    # equivalent at n=3; the rows got more seeds for other pairs, with a large gap later: still equivalent at look 1
    rows = {"fp32": BASE[:6], "x": [0.4405, 0.4595, 0.4203, 0.60, 0.62, 0.61]}
    d = seed_looks(_summary(rows), _done(rows), [3, 6], margin=1.0)
    assert (d.iloc[0].outcome, d.iloc[0].looks, d.iloc[0].n) == ("equivalent", 1, 3)


def test_without_a_baseline_every_pair_is_looked_at():
    rows = {"a": BASE[:3], "b": BASE[:3], "c": BASE[:3]}
    d = seed_looks(_summary(rows, baseline="none"), _done(rows), [3, 6], margin=1.0)
    assert len(d) == 3


def test_pocock_spending_decides_a_large_difference_at_the_first_look_where_obrien_fleming_waits():
    # five points ahead on three seeds, spread 0.5: t = 17 on 2 df; the O'Brien-Fleming-type first look of
    # 3, 6, 9 asks for t ~ 100 (it spends almost nothing), the Pocock type for t ~ 9
    rows = {"fp32": BASE[:3], "good": [BASE[0] + 0.050, BASE[1] + 0.055, BASE[2] + 0.045]}
    obf = seed_looks(_summary(rows), _done(rows), [3, 6, 9], margin=1.0)
    pocock = seed_looks(_summary(rows), _done(rows), [3, 6, 9], margin=1.0, spending="pocock")
    assert obf.iloc[0].outcome == "continue"
    assert (pocock.iloc[0].outcome, pocock.iloc[0].looks, pocock.iloc[0].n) == ("better", 1, 3)


def test_a_decided_pair_stays_decided_when_max_is_raised():
    # differences -0.5, 0.3, 0.6, -0.4, 0.2, -0.2 points (mean 0, se 0.18): equivalent at the second look
    # (n=6) of 3, 6, 9, where |Δ| + 2.98·se = 0.52 <= 1; with max 18 the same look's boundary is 6.45 and the
    # replay alone leaves the pair open (1.13 > 1): the decision recorded at the look (final) is kept instead
    offsets = [-0.5, 0.3, 0.6, -0.4, 0.2, -0.2]
    rows = {"fp32": BASE[:6], "same": [v + o / 100 for v, o in zip(BASE[:6], offsets)]}
    first = seed_looks(_summary(rows), _done(rows), [3, 6, 9], margin=1.0).iloc[0]
    assert (first.outcome, first.looks, first.n) == ("equivalent", 2, 6)
    wider = [3, 6, 9, 12, 15, 18]
    assert seed_looks(_summary(rows), _done(rows), wider, margin=1.0).iloc[0].outcome == "continue"
    kept = {"ssd_tiny.b8.row1-row0": {k: first[k] for k in ("outcome", "looks", "n", "diff", "p_seq", "p_holm")}}
    again = seed_looks(_summary(rows), _done(rows), wider, margin=1.0, final=kept).iloc[0]
    assert (again.outcome, again.looks, again.n, again.verdict, again.final) == (
        "equivalent",
        2,
        6,
        first.verdict,
        True,
    )
    assert rows_to_grow(pd.DataFrame([again]), _done(rows), wider) == {}


def test_a_row_that_diverged_on_a_seed_is_never_equivalent_and_a_skewed_look_decides_nothing():
    # within ±0.05 points on the seeds it finished, but seed 1 diverged: equivalent at the first look before
    same = [v + 0.0005 * o for v, o in zip(BASE[:4], [-1, 0.4, 1, -0.3])]
    summary = _summary({"fp32": BASE[:4], "same": same})
    summary.at[1, "values_by_seed"] = {k: v for k, v in enumerate(same) if k != 1}
    done = {("s", "ssd_tiny", 8, 0): set(range(4)), ("s", "ssd_tiny", 8, 1): set(range(4))}
    d = seed_looks(summary, done, [4, 6, 9], margin=1.0).iloc[0]
    assert d.outcome != "equivalent" and "never equivalent" in d.verdict, d.verdict
    # one seed far out among close ones: Shapiro-Wilk flags the differences, the look decides nothing
    skewed = {"fp32": BASE[:6], "odd": [v + (0.0005 if i != 4 else -0.006) for i, v in enumerate(BASE[:6])]}
    r = seed_looks(_summary(skewed), _done(skewed), [6, 9], margin=1.0).iloc[0]
    assert r.outcome == "continue" and "looked skewed" in r.verdict, r.verdict


def test_a_baseline_that_diverged_everywhere_stops_the_plan():
    # no value on any seed of the baseline: no look can ever compare with it, and every other row got seeds to max
    rows = {"fp32": [], "a": BASE[:3], "b": BASE[3:6]}
    done = _done({"fp32": [0, 0, 0], "a": BASE[:3], "b": BASE[3:6]})
    d = seed_looks(_summary(rows), done, [3, 6, 9], margin=1.0)
    assert set(d["outcome"]) == {"stopped"}
    assert all("fp32 diverged on all 3 seeds" in v for v in d["verdict"]), d["verdict"].tolist()
    assert rows_to_grow(d, done, [3, 6, 9]) == {}
