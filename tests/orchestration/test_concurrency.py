"""8 concurrent trials logging every step lose no metric and never fail on "database is locked".

The same code as benchmarks/concurrent_logging.py (whose 5-minute run is in
docs/records/index.md), for 20 seconds.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "concurrent_logging.py"


@pytest.mark.slow
def test_eight_concurrent_trials_lose_no_metric(tmp_path):
    spec = importlib.util.spec_from_file_location("concurrent_logging", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.run(trials=8, seconds=20, workdir=str(tmp_path))
    assert out["statuses"] == ["finished"]
    assert out["expected_points"] > 8 * 3 * 100  # every trial logged hundreds of steps
    assert out["stored_points"] == out["expected_points"]
