"""benchmarks/eval_curve.py's windowing (the docs pages cite its tables: a loss curve averaged over windows of
steps must put every logged step in exactly one window, the last one keyed by the run's last step)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("eval_curve", Path(__file__).parents[1] / "benchmarks" / "eval_curve.py")
eval_curve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eval_curve)


def test_windows_are_keyed_by_their_last_step_and_hold_each_step_once():
    values = {s: float(s) for s in range(10, 310, 10)}  # logged every 10 steps, 300 steps
    w = eval_curve._windowed(values, 150)
    assert list(w) == [150, 300]
    assert w[150] == sum(range(10, 160, 10)) / 15
    assert w[300] == sum(range(160, 310, 10)) / 15


def test_no_window_leaves_the_values_as_logged():
    values = {0: 1.0, 7: 2.0}
    assert eval_curve._windowed(values, None) == values


def test_table_prints_percent_or_raw_and_the_mean_over_the_columns_with_a_value():
    cols = {"a": {150: 0.25, 300: 0.5}, "b": {150: 0.75}}
    pct = eval_curve.table(cols).splitlines()
    assert pct[2] == "| 150 | 25.0 | 75.0 | 50.0 (2) |"
    assert pct[3] == "| 300 | 50.0 |  | 50.0 (1) |"
    raw = eval_curve.table(cols, percent=False).splitlines()
    assert raw[2] == "| 150 | 0.25 | 0.75 | 0.5 (2) |"
