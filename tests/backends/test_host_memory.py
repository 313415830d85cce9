"""host_memory's malloc settings: that they end the page faults of an allocation pattern glibc's defaults
fault on every round (each arm in a process of its own: the settings are process-wide and permanent),
that ``LSBENCH_MALLOC=system`` keeps the defaults, and that the CPU backend applies them and reports it.

What this cannot show: the step-time gain (benchmarks/host_memory.py measures it), or that values are
unchanged (final weights compared by SHA-256 with and without, docs/records/index.md "Page faults")."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from lossscale_bench.backends import host_memory as host_memory_module
from lossscale_bench.backends.cpu import CPUBackend
from lossscale_bench.backends.host_memory import keep_freed_memory

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's (elsewhere keep_freed_memory does nothing)",
)

# 40 blocks of 1 MiB allocated, touched and freed together, round after round (a step's temporaries), with
# glibc's malloc called directly and torch not imported, so that nothing else allocates in between: with
# glibc's defaults the first round's blocks are mmap-ed (then unmapped), and every later round's come from the
# heap and are trimmed off its top when freed (~10,200 faults a round, every round); with the settings the
# heap keeps them after the first round. (With torch tensors and its threads the same contrast shows, but
# which round glibc starts or stops trimming in varies from process to process.)
_PATTERN = """
import ctypes, importlib.util, json, resource
spec = importlib.util.spec_from_file_location("host_memory", HOST_MEMORY)
host_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_memory)
kept = host_memory.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(1 << 20) for _ in range(40)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks:
        libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
""".replace("HOST_MEMORY", repr(str(Path(host_memory_module.__file__))))


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
    # every round after the first: 40 MiB are 10,240 pages
    assert min(system["faults"][1:]) > 5000, system
    assert max(kept["faults"][1:]) < 50, kept


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


@pytest.mark.parametrize(
    "value,ok",
    [
        (None, True),
        ("", True),
        ("system", True),
        (" System ", True),
        ("kept", True),
        ("sytem", False),
        ("off", False),
        ("0", False),
    ],
)
def test_malloc_setting_values(monkeypatch, value, ok):
    # every value but the three is refused in one line naming the variable and what it takes
    from lossscale_bench.backends.host_memory import MALLOC_ENV, setting_problem

    if value is None:
        monkeypatch.delenv(MALLOC_ENV, raising=False)
    else:
        monkeypatch.setenv(MALLOC_ENV, value)
    problem = setting_problem()
    assert (problem is None) == ok
    assert ok or (
        problem.startswith(f"LSBENCH_MALLOC={value!r} in the environment: allowed: 'system'") and "\n" not in problem
    )
