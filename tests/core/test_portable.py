"""The repeatability switch: a study's ``resources: {repeatable: true}`` (lossscale_bench/core/portable.py).

What these tests can show on one machine (an AVX2 CPU without AVX-512, where they were written):
- each thing the switch pins decides the numbers: a fresh process with ATen at ``default`` instead
  of AVX2, or oneDNN at SSE4.1 instead of AVX2, ends the same trial with other weights, so the
  variables do switch the kernels that train, in the process that trains;
- with the pins, two fresh processes end the trial with identical weights;
- the pins reach the processes that train: the Ray workers of ``lsbench run`` (their record says
  ATen AVX2 and names the caps), and a cluster joined with ``--address`` gets them as the job's
  runtime_env, which reaches a worker whose driver never had them in its environment;
- the switch is in the trial id only when true, and a process that cannot keep it fails the trial.
What they cannot show: that an AVX-512 (or another AVX2) machine gives these same weights; that
needs two machines (the README says which numbers should match). On a CPU without AVX2 the
kernel tests are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import lsbench, study_yaml, write_study
from lossscale_bench.core.portable import PORTABLE_ENV, PinConflict, pin, require_pinned
from lossscale_bench.study import StudyError, load_study_text

CLEAN_ENV = {k: "" for k in PORTABLE_ENV}  # a test's child starts without the caps, whatever the shell set


def _has_avx2() -> bool:
    try:
        return "avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


needs_avx2 = pytest.mark.skipif(not _has_avx2(), reason="the switch caps kernels at AVX2; this CPU has none")


def test_pin_sets_the_caps_and_refuses_another_level():
    env = {"ONEDNN_MAX_CPU_ISA": "avx2"}  # the same level, spelled otherwise: kept
    assert pin(env) == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
    assert env == {**PORTABLE_ENV, "ONEDNN_MAX_CPU_ISA": "avx2"}
    assert pin(env) == {}
    with pytest.raises(PinConflict, match="ATEN_CPU_CAPABILITY=default"):
        pin({"ATEN_CPU_CAPABILITY": "default"})


def test_a_process_without_the_caps_refuses_to_train_a_repeatable_trial():
    with pytest.raises(RuntimeError, match="ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_CBWR not set"):
        require_pinned({})


def test_repeatable_is_in_the_trial_id_only_when_true():
    def tid(resources: str) -> str:
        return load_study_text(study_yaml(resources=resources)).trials()[0].trial_id

    off = tid("{backend: cpu}")
    assert tid("{backend: cpu, repeatable: false}") == off
    assert tid("{backend: cpu, repeatable: true}") != off


def test_repeatable_is_refused_off_the_cpu_backend():
    with pytest.raises(StudyError, match=r"resources\.repeatable: pins the CPU kernels.*not cuda"):
        load_study_text(study_yaml(resources="{backend: cuda, repeatable: true}"))
    with pytest.raises(StudyError, match=r"scaling\[1\]\.resources\.backend: .*not hpu"):
        load_study_text(
            study_yaml(
                resources="{repeatable: true}",
                scaling=["{method: none}", "{method: none, label: g, resources: {backend: hpu}}"],
            )
        )


_TRAIN = textwrap.dedent("""
    import hashlib, json, sys, tempfile
    from pathlib import Path
    import torch
    from lossscale_bench.engine.sink import MemorySink
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
    out = subprocess.run(
        [sys.executable, "-c", _TRAIN, study],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **CLEAN_ENV, **env},
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_avx2
def test_the_pins_decide_the_weights_and_with_them_two_processes_agree():
    study = study_yaml(resources="{backend: cpu, repeatable: true}")
    pinned = {**pin({}), "LSBENCH_NO_COMPILE": "1"}  # fp32 compiles nothing; skip Inductor's start-up
    a, b = _train_fresh(study, pinned), _train_fresh(study, pinned)
    assert a["capability"] == b["capability"] == "AVX2"
    assert a["steps"] == 6 and a["weights"] == b["weights"]
    # the same trial with one library at another level (what another CPU would pick unpinned)
    plain = study_yaml()
    aten = _train_fresh(plain, {**pinned, "ATEN_CPU_CAPABILITY": "default"})
    onednn = _train_fresh(plain, {**pinned, "ONEDNN_MAX_CPU_ISA": "SSE41"})
    assert aten["capability"] == "DEFAULT" and aten["weights"] != a["weights"]
    assert onednn["capability"] == "AVX2" and onednn["weights"] != a["weights"]


def test_connect_ray_hands_the_pins_to_a_joined_cluster_as_runtime_env(monkeypatch):
    """A local Ray inherits the pins from this process's environment; a joined cluster's workers do not,
    so there they travel in the job's runtime_env (cluster.connect_ray says why not both)."""
    import ray

    from lossscale_bench.orchestration import cluster

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(cluster, "probe_address", lambda address: None)
    monkeypatch.delenv("LSBENCH_TEST_PIN", raising=False)
    cluster.connect_ray("10.0.0.1:6379", None, True, env_vars={"LSBENCH_TEST_PIN": "yes"})
    assert calls[-1]["runtime_env"] == {"env_vars": {"LSBENCH_TEST_PIN": "yes"}}
    assert "LSBENCH_TEST_PIN" not in os.environ
    cluster.connect_ray(None, 1, True, env_vars={"LSBENCH_TEST_PIN": "yes"})
    assert "runtime_env" not in calls[-1] and os.environ["LSBENCH_TEST_PIN"] == "yes"


_WORKER_ENV = textwrap.dedent("""
    import os, ray
    ray.init(address="local", num_cpus=1, include_dashboard=False, runtime_env={"env_vars": {"LSBENCH_TEST_PIN": "yes"}})
    print("driver", os.environ.get("LSBENCH_TEST_PIN"))
    print("worker", ray.get(ray.remote(lambda: os.environ.get("LSBENCH_TEST_PIN")).remote()))
    ray.shutdown()
""")


@pytest.mark.slow
def test_a_job_runtime_env_reaches_a_worker_the_driver_env_does_not():
    """What the joined-cluster path relies on (as connect_ray passes it): a worker gets the job's
    env_vars though the driver's environment lacks them (a cluster's nodes never see that one)."""
    out = subprocess.run(
        [sys.executable, "-c", _WORKER_ENV],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "LSBENCH_TEST_PIN"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["driver None", "worker yes"], out.stdout


@pytest.mark.slow
def test_lsbench_run_pins_the_ray_workers_and_records_it(tmp_path):
    """Through the CLI and Ray, from a shell without the caps: the trial's ``lsbench.backend`` tag
    (written in the worker) names the caps and, on an AVX2 CPU, the AVX2 kernels."""
    study = write_study(
        tmp_path,
        schedule={"iterations": 2, "lr": 0.01, "warmup_iterations": 1},
        resources="{backend: cpu, repeatable: true}",
    )
    out = lsbench(
        "run", study, "--runs-dir", tmp_path / "runs", "--no-report", "--quiet", "--num-cpus", "1", env=CLEAN_ENV
    )
    assert out.returncode == 0, out.stderr
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = [
        r
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id])
        if r.data.tags.get("lsbench.role") == "trial"
    ]
    assert len(runs) == 1 and runs[0].data.tags["lsbench.status"] == "finished", runs[0].data.tags
    tag = runs[0].data.tags["lsbench.backend"]
    assert all(f"{k}={v}" in tag for k, v in PORTABLE_ENV.items()), tag
    if _has_avx2():
        assert "ATen AVX2" in tag, tag


def test_lsbench_run_refuses_a_shell_that_sets_another_level(tmp_path):
    study = write_study(tmp_path, resources="{backend: cpu, repeatable: true}")
    out = lsbench(
        "run",
        study,
        "--runs-dir",
        tmp_path / "runs",
        "--no-report",
        "--quiet",
        env={**CLEAN_ENV, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "lsbench: error: resources.repeatable pins ONEDNN_MAX_CPU_ISA=AVX2, but the "
        "environment sets ONEDNN_MAX_CPU_ISA=AVX512_CORE: unset it (or drop repeatable) "
        "and run again"
    )
    assert not (tmp_path / "runs" / "mlflow.db").exists()
