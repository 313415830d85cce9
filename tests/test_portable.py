"""The repeatability switch (``lsbench run --portable-cpu``, lossscale_bench/portable.py).

What these tests can show on one machine: the switch reaches the processes that train (torch in
them runs its AVX2 kernels and the trial's record says so), and with it a trial is bit for bit
repeatable from one fresh process to the next (identical final weights). What they cannot show:
that an AVX-512 machine gives the same weights as this one; that needs two machines (the README
says which numbers should match). On a CPU without AVX2 the kernel-level test is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import lsbench, study_yaml, write_study
from lossscale_bench.portable import PORTABLE_ENV, pin


def _has_avx2() -> bool:
    try:
        return "avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_pin_sets_the_caps_and_keeps_what_the_user_set():
    env = {"ONEDNN_MAX_CPU_ISA": "SSE41"}
    assert pin(env) == {"ATEN_CPU_CAPABILITY": "avx2"}
    assert env == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "SSE41"}
    assert pin(env) == {}


_TRAIN = textwrap.dedent("""
    import hashlib, json, sys, tempfile
    from pathlib import Path
    import torch
    from lossscale_bench.sink import MemorySink
    from lossscale_bench.study import load_study_text
    from lossscale_bench.trial import runner, setup
    from lossscale_bench.data.dali import make_batches
    cfg = load_study_text(sys.argv[1]).trials()[0]
    tmp = Path(tempfile.mkdtemp())
    parts = setup.build_parts(cfg, MemorySink(), tmp, 1)
    trainer = runner._trainer(cfg, parts, MemorySink(), tmp, tmp / "ck.pt", 10 ** 9, 0, None)
    trainer.batches = iter(make_batches(cfg, parts.train_ds, 0))
    trainer.run()
    h = hashlib.sha256()
    for k, v in sorted(trainer.model.state_dict().items()):
        h.update(k.encode()); h.update(v.detach().contiguous().cpu().numpy().tobytes())
    print(json.dumps({"weights": h.hexdigest(), "capability": torch.backends.cpu.get_cpu_capability(),
                      "steps": trainer.state.step}))
""")


def _train_fresh(study: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _TRAIN, study], capture_output=True, text=True, timeout=600,
                         env={**os.environ, **env}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not _has_avx2(), reason="the switch caps kernels at AVX2; this CPU has none")
def test_with_the_switch_two_fresh_processes_end_with_identical_weights():
    study = study_yaml(precision="fp8-e4m3-emulated", scaling=["{method: fixed, scale: 128}"],
                       schedule={"iterations": 6, "lr": 0.01, "warmup_iterations": 2},
                       eval={"every": "null", "metric": "coco"})
    env = pin({})
    a, b = _train_fresh(study, env), _train_fresh(study, env)
    assert a["capability"] == b["capability"] == "AVX2"
    assert a["steps"] == 6 and a["weights"] == b["weights"]


@pytest.mark.slow
def test_run_portable_cpu_reaches_the_trial_and_its_record(tmp_path):
    """Through the CLI (local executor, so the trial runs in the CLI's own process: the switch must
    act before torch is imported there): the trial's ``lsbench.backend`` tag names the caps."""
    study = write_study(tmp_path, schedule={"iterations": 2, "lr": 0.01, "warmup_iterations": 1},
                        eval={"every": "null", "metric": "coco"})
    env = {k: "" for k in PORTABLE_ENV}
    out = lsbench("run", study, "--portable-cpu", "--executor", "local", "--runs-dir", tmp_path / "runs",
                  "--no-report", "--quiet", env=env)
    assert out.returncode == 0, out.stderr
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
            if r.data.tags.get("lsbench.role") == "trial"]
    assert runs and all("ATEN_CPU_CAPABILITY=avx2" in r.data.tags["lsbench.backend"] for r in runs)
    if _has_avx2():
        assert all("ATen AVX2" in r.data.tags["lsbench.backend"] for r in runs)
