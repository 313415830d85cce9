"""benchmarks/step_ratio.py (docs/records/index.md cites its tables): the paired bootstrap interval, and a
two-row run through the trial's own parts (timings are not checked: only that it measures what it says)."""

import importlib.util
import statistics
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("step_ratio", Path(__file__).parents[1] / "benchmarks" / "step_ratio.py")
step_ratio = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_ratio)


def test_the_ratio_is_of_means_and_its_interval_is_paired_by_round():
    base = [1.0, 2.0, 3.0, 4.0] * 10
    r, lo, hi = step_ratio.ratio_interval([2 * b for b in base], base)
    assert (r, lo, hi) == (2.0, 2.0, 2.0)  # a row that is twice the base in every round: no spread
    noisy = [b * (1.5 if i % 2 else 0.5) for i, b in enumerate(base)]
    r, lo, hi = step_ratio.ratio_interval(noisy, base)
    assert r == pytest.approx(statistics.fmean(noisy) / statistics.fmean(base))
    assert lo < r < hi
    assert step_ratio.ratio_interval(noisy, base, seed=1) != step_ratio.ratio_interval(noisy, base, seed=2)


def test_two_rows_interleaved_through_the_trials_parts(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["step_ratio.py", "--rows", "0", "1", "--iterations", "3", "--warmup", "1"])
    step_ratio.main()
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "×" in ln]
    assert [r.split(" | ")[0] for r in rows] == ["| FP32 baseline", "| E4M3: no loss scale"]
    assert "1.000× [1.000, 1.000]" in rows[0]
    assert "3 timed iterations per row after 1, interleaved" in out


def test_precision_replaces_every_rows_own():
    label, _, trainer, log_every = step_ratio.build(str(step_ratio.ROOT / "studies" / "smoke.yaml"), 4, 0, 1, "fp32")
    assert label == "E4M3: layer-wise dynamic (fairscale) [fp32]"
    assert type(trainer.scaler).__name__ == "LayerwiseDynamicLossScaler" and trainer.precision.name == "fp32"
    assert log_every == 10


def test_logging_cost_is_the_logged_steps_extra_spread_over_log_every():
    times = [0.1] * 9 + [0.2]  # one logged step in ten costs 100 ms more: 10 ms a step, of a 110-ms mean
    assert step_ratio.logging_cost(times, [False] * 9 + [True], 10) == "200.0 / 100.0 | 9.1 %"
    assert step_ratio.logging_cost(times, [False] * 10, 10) == "– | –"
