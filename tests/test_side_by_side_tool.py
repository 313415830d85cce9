"""benchmarks/side_by_side.py's reading of `lsbench report` cells and its table (docs/results/kangaroo_e4m3.md cites it)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "side_by_side", Path(__file__).parents[1] / "benchmarks" / "side_by_side.py"
)
side_by_side = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(side_by_side)


def test_a_verdict_cell_becomes_its_interval_and_word():
    cell = "worse than baseline (paired, p=0.0098), Δ -23.92 [-34.19, -13.64], P(>)=0.00 [0.00, 0.00]"
    assert side_by_side.verdict(cell) == "-23.92 [-34.19, -13.64], worse"
    cell = "inconclusive (Welch, p=0.53), Δ -1.86 [-12.42, +8.70], P(>)=0.67 [0.00, 1.00]; ±1.0 needs ~72 seeds"
    assert side_by_side.verdict(cell) == "-1.86 [-12.42, +8.70], inconclusive"
    assert side_by_side.verdict("baseline") == "baseline"
    assert side_by_side.verdict("too few seeds (n=1)") == "too few seeds (n=1)"


def test_separator_rows_are_not_rows():
    text = "| a | b |\n|---|:-:|\n| 1 | 2 |\nnot a row\n"
    assert side_by_side.md_rows(text) == [["a", "b"], ["1", "2"]]


def test_the_table_keeps_rows_both_sides_have_in_the_second_sides_order_with_loss_relative_to_fp32():
    left = (
        "photos",
        {"FP32 baseline": "baseline", "x": "v1", "only left": "v"},
        {"FP32 baseline": 4.0, "x": 5.0, "only left": 1.0},
        "1500",
    )
    right = ("shapes", {"x": "w1", "FP32 baseline": "baseline"}, {"FP32 baseline": 2.0, "x": 1.0}, "500")
    lines = side_by_side.table([left, right]).splitlines()
    assert lines[0] == (
        "| row | photos: Δ mAP vs FP32 [95 %], verdict | shapes: Δ mAP vs FP32 [95 %], verdict | "
        "photos: training loss, last window (step 1500), vs FP32 | shapes: training loss, last "
        "window (step 500), vs FP32 |"
    )
    assert lines[2] == "| x | v1 | w1 | 5.000 (+25.0%) | 1.000 (-50.0%) |"
    assert lines[3] == "| FP32 baseline | baseline | baseline | 4.000 (+0.0%) | 2.000 (+0.0%) |"
    assert len(lines) == 4
