"""Placement of a mixed-backend study on a fake cluster: trials land only where their resource exists.

A local Ray cluster of three nodes stands in for the one in docs/guide/cluster.md: a
head node that is also the "TPU node" (``resources={"TPU": 4}``), a "GPU node"
(``num_gpus=2``) and a "Gaudi node" (``resources={"HPU": 2}``). The
trials are real ``TrialConfig``s of a cpu, a cuda, an hpu and an xla study plus
two multi-device (2 × GPU, 2 × HPU) ones, scheduled by Ray Tune with the
tune runner's own ``_resources_of``; the trainable is a probe that records where it
ran (node, assigned resources, ``CUDA_VISIBLE_DEVICES`` /
``HABANA_VISIBLE_MODULES`` / ``TPU_VISIBLE_CHIPS``) instead of training. For the
multi-device trials the probe starts the real Ray Train worker group of
``lossscale_bench.orchestration.distributed`` (gloo process group, since nothing here has a
GPU or Gaudi) with a probe worker function.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

ray = pytest.importorskip("ray")

from lossscale_bench.orchestration import distributed, placement  # noqa: E402
from lossscale_bench.study import load_study_text  # noqa: E402

STUDY = textwrap.dedent("""\
    name: place_{tag}
    dataset: {{name: synthetic, train_images: 16, val_images: 8, image_size: 64}}
    model: ssd_tiny
    batch_size: 4
    precision: {precision}
    scaling:
      - {{method: none}}
    seeds: [0]
    schedule: {{iterations: 2, lr: 0.01, warmup_iterations: 0}}
    resources: {{backend: {backend}, devices_per_trial: {devices}, cpus_per_trial: 0.5}}
    """)

CASES = [  # tag, backend, devices, precision
    ("cpu", "cpu", 1, "fp32"),
    ("gpu", "cuda", 1, "mixed16"),
    ("hpu", "hpu", 1, "bf16"),
    ("tpu", "xla", 1, "bf16"),
    ("gpu2", "cuda", 2, "mixed16"),
    ("hpu2", "hpu", 2, "bf16"),
]
ENV = ("CUDA_VISIBLE_DEVICES", "HABANA_VISIBLE_MODULES", "TPU_VISIBLE_CHIPS")


def _where(rank=None) -> dict:
    ctx = ray.get_runtime_context()
    return {
        "node": ctx.get_node_id(),
        "rank": rank,
        "resources": {k: v for k, v in ctx.get_assigned_resources().items() if not k.startswith("node:")},
        "env": {k: os.environ.get(k) for k in ENV},
    }


def _probe_worker(config: dict) -> None:
    import ray.train

    config["queue"].put({"kind": "report", "report": _where(ray.train.get_context().get_world_rank())})


def _no_setup_config():
    """A TorchConfig that sets nothing up: Ray's HPU device manager needs habana_frameworks, absent here."""
    from dataclasses import dataclass

    from ray.train.backend import Backend
    from ray.train.torch import TorchConfig

    class _NoSetup(Backend):
        pass

    @dataclass
    class NoSetupConfig(TorchConfig):
        @property
        def backend_cls(self):
            return _NoSetup

    return NoSetupConfig()


def _probe_trainable(config: dict) -> None:
    from ray import tune

    spec = config["trial"]
    res = spec["cfg"]["resources"]
    out = {"tag": spec["cfg"]["study"], "driver": _where()}
    if placement.is_distributed(res):
        workers: list = []
        # the real placement and (for cuda) the real one-GPU-per-worker config, with gloo: no devices here
        cfg = _no_setup_config() if res["backend"] == "hpu" else None
        err = distributed.fit_streaming(
            spec,
            lambda item: workers.append(item["report"]),
            worker_fn=_probe_worker,
            pg_backend="gloo",
            train_torch_config=cfg,
        )
        out["workers"], out["error"] = workers, repr(err) if err else None
    tune.report({"probe": json.dumps(out)})


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"TPU": 4}})
    nodes = {"gpu": c.add_node(num_cpus=2, num_gpus=2), "hpu": c.add_node(num_cpus=2, resources={"HPU": 2})}
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    c.wait_for_nodes()
    ids = {"tpu": c.head_node.node_id, **{k: n.node_id for k, n in nodes.items()}}
    try:
        yield ids
    finally:
        ray.shutdown()
        c.shutdown()


def test_mixed_study_trials_land_only_where_their_resource_exists(cluster, tmp_path):
    from ray import cloudpickle, tune

    from lossscale_bench.orchestration.tune_runner import _resources_of

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the probe runs in Ray workers
    specs = []
    for tag, backend, devices, precision in CASES:
        (cfg,) = load_study_text(STUDY.format(tag=tag, backend=backend, devices=devices, precision=precision)).trials()
        specs.append(
            {
                "cfg": cfg.to_dict(),
                "trial_dir": str(tmp_path / tag),
                "threads": 1,
                "resources": placement.single_bundle(cfg.resources),
            }
        )
    limit = placement.tune_concurrency([s["cfg"]["resources"] for s in specs], ray.cluster_resources())
    tuner = tune.Tuner(
        tune.with_resources(_probe_trainable, _resources_of),
        param_space={"trial": tune.grid_search(specs)},
        tune_config=tune.TuneConfig(max_concurrent_trials=limit),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "ray"), verbose=0),
    )
    results = tuner.fit()
    assert not results.errors, results.errors
    probes = {p["tag"].removeprefix("place_"): p for p in (json.loads(r.metrics["probe"]) for r in results)}
    assert set(probes) == {c[0] for c in CASES}
    node = cluster

    # single-device trials: on the node that has the device, holding exactly one
    assert probes["cpu"]["driver"]["resources"] == {"CPU": 0.5}
    gpu, hpu, tpu = probes["gpu"]["driver"], probes["hpu"]["driver"], probes["tpu"]["driver"]
    assert gpu["node"] == node["gpu"] and gpu["resources"] == {"CPU": 0.5, "GPU": 1.0}
    assert gpu["env"]["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    assert hpu["node"] == node["hpu"] and hpu["resources"] == {"CPU": 0.5, "HPU": 1.0}
    assert hpu["env"]["HABANA_VISIBLE_MODULES"] in ("0", "1")
    assert tpu["node"] == node["tpu"] and tpu["resources"] == {"CPU": 0.5, "TPU": 1.0}
    assert tpu["env"]["TPU_VISIBLE_CHIPS"] in ("0", "1", "2", "3")

    # multi-device trials: the Tune trial drives with CPU:0.25 and no device; the Train workers hold one each
    for tag, dev, env in (("gpu2", "GPU", "CUDA_VISIBLE_DEVICES"), ("hpu2", "HPU", "HABANA_VISIBLE_MODULES")):
        p = probes[tag]
        assert p["error"] is None, p["error"]
        assert p["driver"]["resources"] == {"CPU": placement.DRIVER_CPUS}
        workers = sorted(p["workers"], key=lambda w: w["rank"])
        assert [w["rank"] for w in workers] == [0, 1]
        for w in workers:
            assert w["node"] == node[tag[:3]], (tag, w)
            assert w["resources"] == {"CPU": 0.5, dev: 1.0}
        # each worker sees its own device only (for CUDA: not Ray Train's shared CUDA_VISIBLE_DEVICES)
        visible = [w["env"][env] for w in workers]
        assert sorted(visible) == ["0", "1"], visible


def test_placement_shapes_and_feasibility():
    gpu8 = {"backend": "cuda", "devices_per_trial": 8, "cpus_per_trial": 4}
    assert placement.placement_text(gpu8) == "CPU:0.25 + 8×{CPU:4, GPU:1}"
    assert placement.placement_text({"backend": "hpu", "devices_per_trial": 1, "cpus_per_trial": 2}) == "CPU:2, HPU:1"
    assert placement.placement_text({"backend": "xla", "devices_per_trial": 8}) == "CPU:0.25 + 1×{CPU:1, TPU:8}"
    assert placement.placement_text({"backend": "cpu", "devices_per_trial": 2}) == "CPU:0.25 + 2×{CPU:1}"
    cluster = {"CPU": 64.0, "GPU": 8.0}
    assert placement.infeasible(gpu8, cluster) is None
    msg = placement.infeasible({"backend": "hpu", "devices_per_trial": 2}, cluster)
    assert "HPU 2 (cluster has 0)" in msg
    # Tune sees only the driver's CPU: the limit comes from the scarcest device
    assert placement.tune_concurrency([gpu8, gpu8, gpu8], {"CPU": 64.0, "GPU": 16.0}) == 2
    hpu1 = {"backend": "hpu", "devices_per_trial": 1, "cpus_per_trial": 1}
    assert placement.tune_concurrency([gpu8] * 3 + [hpu1] * 5, {"CPU": 64.0, "GPU": 16.0, "HPU": 4.0}) == 2 + 4
    assert placement.tune_concurrency([{"backend": "cuda", "devices_per_trial": 1}], {"GPU": 8.0}) is None
    assert "not placeable" in placement.placement_text({"backend": "auto", "devices_per_trial": 2})
    with pytest.raises(ValueError, match="auto cannot"):
        placement.worker_bundles({"backend": "auto", "devices_per_trial": 2})


def test_feasibility_check_on_the_real_cluster(cluster):
    """``check_feasible`` on the live ``ray.nodes()`` of the three-node cluster above."""
    from lossscale_bench.orchestration.cluster import Infeasible, check_feasible, cluster_nodes, probe_address

    nodes = cluster_nodes()
    assert len(nodes) == 3 and sum(n.get("GPU", 0) for n in nodes) == 2
    fits = load_study_text(STUDY.format(tag="f", backend="cuda", devices=2, precision="mixed16"))
    check_feasible(fits, fits.trials(), nodes)  # two 1-GPU workers on the GPU node
    too_many = load_study_text(STUDY.format(tag="f", backend="cuda", devices=4, precision="mixed16"), "g.yaml")
    with pytest.raises(Infeasible, match=r"g.yaml: resources.devices_per_trial: .*4 GPUs in all.*2 GPUs"):
        check_feasible(too_many, too_many.trials(), nodes)
    probe_address(ray.get_runtime_context().gcs_address)  # a real GCS answers the gRPC hello
