"""host_memory's malloc settings: that they end the page faults of an allocation pattern glibc's defaults
fault on every time (each arm in a process of its own: the settings are process-wide and permanent),
that ``LSBENCH_MALLOC=system`` keeps the defaults, and that the CPU backend applies them and reports it.

What this cannot show: the step-time gain (benchmarks/host_memory.py measures it), or that values are
unchanged (final weights compared by SHA-256 with and without, docs/benchmarks.md "Page faults")."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from lossscale_bench.backends.cpu import CPUBackend
from lossscale_bench.backends.host_memory import keep_freed_memory

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="the settings are glibc's (elsewhere keep_freed_memory does nothing)")

# tensors of mixed sizes allocated and freed together, a small one left at the heap's top each time: the
# shape of a training step's temporaries; glibc's defaults return the freed heap top to the kernel and
# the next round faults it in again
_PATTERN = """
import json, resource, torch
from lossscale_bench.backends.host_memory import keep_freed_memory
kept = keep_freed_memory()
faults = []
for i in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ts = [torch.ones(n) for n in (262144, 524288, 1048576, 262144, 2000000, 100000)]
    pin = torch.ones(1000 + i)
    del ts
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""


def _pattern(malloc: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LSBENCH_MALLOC"}
    if malloc is not None:
        env["LSBENCH_MALLOC"] = malloc
    out = subprocess.run([sys.executable, "-c", _PATTERN], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_the_settings_end_the_faults_that_the_defaults_take_every_round():
    system, kept = _pattern("system"), _pattern(None)
    assert system["kept"] is False and kept["kept"] is True
    # the last rounds, after both arms have grown their heap: ~16 MB of tensors are ~3,900 pages
    assert min(system["faults"][-3:]) > 1000, system
    assert max(kept["faults"][-3:]) < 50, kept


@glibc
def test_system_is_read_case_blind_and_only_that_word_opts_out():
    assert _pattern(" System ")["kept"] is False
    assert _pattern("kept")["kept"] is True


@glibc
def test_the_cpu_backend_applies_them_and_reports_faults_with_the_peak_size():
    backend = CPUBackend()
    assert backend.keeps_freed_memory is True and keep_freed_memory() is True
    stats = backend.memory_stats()
    assert stats["host_freed_memory_kept"] == 1.0
    assert stats["host_minor_faults"] > 0 and stats["host_max_rss_mb"] > 0
