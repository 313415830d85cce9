"""Resources no node can ever provide, a backend the cluster lacks, an unreachable ``--address``:
one line, exit 2, well within 60 s, and no MLflow run left open.

Ray itself accepts such requests and waits in silence (``lsbench run`` hung until killed after
100-240 s). The cluster-shape arithmetic is checked on node lists here; the real ``ray.nodes()``
of a multi-node cluster in tests/test_placement.py.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import time

import pytest

from helpers import study_yaml
from lossscale_bench.orchestration.cluster import ClusterUnavailable, Infeasible, check_feasible, probe_address
from lossscale_bench.orchestration.placement import cluster_text, trial_bundles, unplaceable
from lossscale_bench.study import load_study_text

CLI = [sys.executable, "-m", "lossscale_bench.cli"]
LAPTOP = [{"CPU": 2.0, "memory": 8e9}]
GPU_NODES = [{"CPU": 32.0}, {"CPU": 8.0, "GPU": 4.0}, {"CPU": 8.0, "GPU": 4.0}]


@pytest.mark.parametrize(
    "res, nodes, key, words",
    [
        ({"backend": "cuda"}, LAPTOP, "backend", ["cuda trials need a GPU", "the cluster has 2 CPUs, no GPU"]),
        ({"backend": "hpu", "devices_per_trial": 2}, GPU_NODES, "backend", ["HPU", "no HPU", "8 GPUs"]),
        (
            {"backend": "cpu", "cpus_per_trial": 1000},
            LAPTOP,
            "cpus_per_trial",
            ["CPU:1000 on one node", "no node has that much"],
        ),
        # 16 CPUs exist on no GPU node, though the cluster has 48 CPUs and 8 GPUs
        (
            {"backend": "cuda", "cpus_per_trial": 16},
            GPU_NODES,
            "cpus_per_trial",
            ["no node has all of it", "48 CPUs (at most 32 on one node)", "8 GPUs (at most 4 on one node)"],
        ),
        # eight 1-GPU workers: bundles fit nodes, but only 8 GPUs in all for 9 needed
        ({"backend": "cuda", "devices_per_trial": 9}, GPU_NODES, "devices_per_trial", ["9 GPUs in all"]),
        # torch_xla: one worker holds every chip, so 8 chips must be on one node
        (
            {"backend": "xla", "devices_per_trial": 8},
            [{"CPU": 8.0, "TPU": 4.0}] * 2,
            "devices_per_trial",
            ["TPU:8 on one node"],
        ),
        ({"backend": "auto", "devices_per_trial": 2}, LAPTOP, "backend", ["auto cannot"]),
    ],
)
def test_unplaceable_names_the_field_and_what_the_cluster_has(res, nodes, key, words):
    found = unplaceable(res, nodes)
    assert found is not None and found[0] == key, found
    for w in words:
        assert w in found[1], (w, found[1])


@pytest.mark.parametrize(
    "res, nodes",
    [
        ({"backend": "cuda", "devices_per_trial": 8, "cpus_per_trial": 4}, GPU_NODES),  # workers spread over nodes
        ({"backend": "cuda", "cpus_per_trial": 8}, GPU_NODES),
        ({"backend": "cpu", "cpus_per_trial": 2}, LAPTOP),
        ({"backend": "auto"}, LAPTOP),  # auto takes what the worker has: CPU here
        ({"backend": "xla", "devices_per_trial": 4}, [{"CPU": 8.0, "TPU": 4.0}] * 2),
    ],
)
def test_placeable_trials_pass(res, nodes):
    assert unplaceable(res, nodes) is None


def test_cluster_text():
    assert cluster_text(LAPTOP, ("GPU",)) == "the cluster has 2 CPUs, no GPU"
    assert cluster_text([{"CPU": 1.0, "GPU": 1.0}]) == "the cluster has 1 CPU, 1 GPU"


def _study(backend: str) -> str:
    """Three rows on ``backend``; the third asks for 1000 CPUs."""
    return study_yaml(
        name="feasible",
        dataset={"name": "synthetic", "train_images": 8, "val_images": 4, "image_size": 64, "seed": 0},
        resources={"backend": backend},
        seeds=None,
        log_every=None,
        scaling=[
            "{method: none}",
            "{method: fixed, scale: 128}",
            "{method: fixed, scale: 256, resources: {backend: cpu, cpus_per_trial: 1000}}",
        ],
        schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 1},
        eval={"every": 4, "metric": "coco", "max_images": 4},
    )


def test_check_feasible_names_each_field_where_the_file_sets_it():
    study = load_study_text(_study("cuda"), "studies/mine.yaml")
    with pytest.raises(Infeasible) as e:
        check_feasible(study, study.trials(), LAPTOP)
    msg = str(e.value)
    assert msg.startswith("studies/mine.yaml: resources.backend: cuda trials need a GPU")
    assert "; scaling[2].resources.cpus_per_trial: a trial needs CPU:1000" in msg
    assert msg.count("resources.backend") == 1  # two cuda rows, one problem
    assert "\n" not in msg and "LSBENCH_SKIP_RESOURCE_CHECK=1" in msg
    assert "--num-cpus" not in msg  # a GPU is not made by logical CPUs, and this is not our own Ray
    study = load_study_text(_study("cpu"), "mine.yaml")
    check_feasible(study, study.trials()[:2], LAPTOP)  # the rows that fit pass


def test_a_local_ray_short_of_cpus_is_told_the_num_cpus_that_fits():
    """A 2-device CPU trial (2 workers and a driver) on a 2-core machine: --num-cpus is the simple fix."""
    study = load_study_text(study_yaml(resources={"backend": "cpu", "devices_per_trial": 2}), "d.yaml")
    with pytest.raises(Infeasible) as e:
        check_feasible(study, study.trials(), LAPTOP, local=True)
    need = sum(b.get("CPU", 0) for b in trial_bundles(study.trials()[0].resources))
    assert need > 2 and f"--num-cpus {math.ceil(need)} gives this machine's Ray" in str(e.value)
    with pytest.raises(Infeasible) as e:  # joined cluster: its CPUs are real, no such advice
        check_feasible(study, study.trials(), LAPTOP, local=False)
    assert "--num-cpus" not in str(e.value)
    check_feasible(study, study.trials(), [{"CPU": float(need)}], local=True)  # and that many do fit


def _run(tmp_path, *extra, timeout=60):
    t0 = time.time()
    r = subprocess.run(
        CLI + ["run", str(tmp_path / "s.yaml"), "--runs-dir", str(tmp_path / "runs"), "--no-report", *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return r, time.time() - t0


def _open_runs(runs):
    from mlflow.tracking import MlflowClient

    if not (runs / "mlflow.db").exists():
        return []
    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps) if exps else []


@pytest.mark.slow
def test_run_on_a_cluster_without_the_resources_ends_at_once(tmp_path):
    import torch

    backend = "hpu" if torch.cuda.is_available() else "cuda"  # a device this machine does not have
    (tmp_path / "s.yaml").write_text(_study(backend))
    r, took = _run(tmp_path, "--num-cpus", "1")
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-3000:])
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("lsbench: error:")]
    assert len(errs) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    # nothing else on stderr: Ray's per-start token-authentication warning is silenced for our own instance
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == errs, r.stderr[-3000:]
    assert "resources.backend" in errs[0] and "the cluster has 1 CPU, no " in errs[0]
    assert "scaling[2].resources.cpus_per_trial" in errs[0]
    assert took < 60
    assert not _open_runs(tmp_path / "runs")  # checked before any run was opened


def test_unreachable_address_is_one_line_exit_2(tmp_path):
    (tmp_path / "s.yaml").write_text(_study("cpu"))
    r, took = _run(tmp_path, "--address", "127.0.0.1:1")
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-3000:])
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert "cannot join the Ray cluster at 127.0.0.1:1: nothing listens" in r.stderr
    assert took < 60
    assert not _open_runs(tmp_path / "runs")


def test_probe_tells_apart_names_that_do_not_resolve_and_ports_that_are_not_ray():
    with pytest.raises(ClusterUnavailable, match="does not resolve"):
        probe_address("no-such-host.invalid:6379", timeout=5)
    with socket.socket() as s:  # accepts connections, says nothing: what ray.init waited on for minutes
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        t0 = time.time()
        with pytest.raises(ClusterUnavailable, match="not a Ray cluster"):
            probe_address(f"ray://127.0.0.1:{port}", timeout=2)
        assert time.time() - t0 < 10
    probe_address("auto")  # no port: left to Ray


@pytest.mark.parametrize(
    "address, words",
    [
        ("foo", "Invalid address format: foo"),  # Ray's ValueError was a traceback, exit 1
        ("ray://foo", "cannot join the Ray cluster at ray://foo"),  # ray:// without ray[client]: a ValueError too
        ("127.0.0.1:99999", "port 99999 is not a TCP port"),  # was "nothing listens on port 99999"
    ],
)
def test_malformed_address_is_a_cluster_error_not_a_traceback(address, words):
    from lossscale_bench.orchestration.cluster import connect_ray

    with pytest.raises(ClusterUnavailable, match=words.replace(".", r"\.")):
        connect_ray(address, 1, True)


def test_a_ray_error_quoting_a_traceback_becomes_one_plain_line():
    """A GCS that never answers: Ray's ConnectionError reads "Failed to connect to GCS at address
    10.255.255.1:6379 within 5 seconds. Last connection error: Traceback (most recent call last): ..."
    (seen for an unroutable address). The one-line error keeps the first sentence, not the traceback."""
    from lossscale_bench.orchestration.cluster import _first_words

    text = (
        "Failed to connect to GCS at address 10.255.255.1:6379 within 5 seconds. Last connection error: "
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nRpcError: deadline'
    )
    got = _first_words(text, ConnectionError(text))
    assert got == "Failed to connect to GCS at address 10.255.255.1:6379 within 5 seconds"
    assert "Traceback" not in _first_words("Traceback (most recent call last):", ConnectionError())
    assert _first_words("", RuntimeError()) == "RuntimeError"
