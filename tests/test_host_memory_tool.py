"""benchmarks/host_memory.py (docs/records/index.md "Page faults" cites its table): its paired interval, and one
round of one row, each arm in a child process of its own, with the arm's setting checked in the child
(timings are not checked: only that it measures what it says)."""

import importlib.util
import platform
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "host_memory_tool", Path(__file__).parents[1] / "benchmarks" / "host_memory.py"
)
host_memory_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host_memory_tool)


def test_the_ratio_is_kept_over_defaults_paired_by_round():
    r, lo, hi = host_memory_tool.ratio_interval([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert (r, lo, hi) == (0.5, 0.5, 0.5)
    r, lo, hi = host_memory_tool.ratio_interval([1.0, 3.0, 2.0, 2.5], [2.0, 2.0, 2.0, 2.0])
    assert lo < r < hi


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting exists on glibc only")
def test_one_round_runs_both_arms_in_their_own_processes(monkeypatch, capsys):
    monkeypatch.setattr(
        "sys.argv", ["host_memory.py", "--rows", "0", "--rounds", "1", "--warmup", "1", "--iterations", "2"]
    )
    host_memory_tool.main()  # raises SystemExit if an arm ran with the other arm's setting
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| FP32 baseline")]
    assert len(rows) == 1 and "→" in rows[0]
    assert "1 rounds of one child process per arm, 2 timed iterations each after 1" in out
