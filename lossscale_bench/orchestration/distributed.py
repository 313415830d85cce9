"""Multi-device trials: one Tune trial drives a Ray Train ``TorchTrainer`` with N workers.

A study with ``resources.devices_per_trial: N > 1`` runs each trial data-parallel
over N devices, the way the published studies ran ``mpiexec -n 8``::

    Tune trial (the Train driver, CPU:0.25, no device)      driver side: MlflowFunnel
      ├─ thread: TorchTrainer.fit() ─▶ Train controller ─▶ N workers, one device each
      │                                                     rank r: run_trial(rank=r, world_size=N,
      │                                                             grad_sync=GradSync())
      └─ polls a ray.util.queue.Queue ◀── rank 0's QueueSink payloads
         and forwards each with tune.report ─────────────▶ one MLflow run per trial

*Placement (Ray 2.60, Train V2).* The Tune function only launches and watches
the Train run, so it holds a small CPU share and no device; the Train worker
group reserves its own placement group, ``N × {CPU: cpus_per_trial, <DEV>: 1}``
(PACK). Nesting the devices into the Tune trial's bundle as well would reserve
them twice and deadlock (Train V2 always creates its own placement group and
cannot adopt Tune's). Consequences, both handled here: Tune no longer sees the
device demand, so :func:`~.placement.tune_concurrency` gives the ``max_concurrent_trials``
that keeps Tune from starting trials whose Train runs can only wait; and a
trial whose devices the cluster does not have at all fails at once with a
message (:func:`~.placement.infeasible`) instead of waiting forever for them.

*Gradients.* There is no DDP: each replica runs the same ``run_trial`` on its
shard ``images[rank::N]`` of the global batch (``batch_size`` is the global
batch), its scaler unscales its own gradients (per layer for adaptive scaling),
and :class:`~.replica_sync.GradSync` then averages the true gradients with one flattened
all-reduce per dtype. Overflow flags are max-reduced inside the scalers
(``scaling.base.all_reduce_flag``), so every replica skips the same steps and
the weights stay identical; at the end rank 0 compares per-tensor parameter
sums of all replicas and logs the largest difference as ``replica_param_drift``
(0.0 when they agree bit for bit).

*Process groups.* cpu: gloo; cuda: nccl, with each worker seeing only its own
GPU (``CUDA_VISIBLE_DEVICES`` not shared, so the CUDA backend's ``cuda:0`` is
that worker's GPU; NCCL then uses shared memory/network rather than CUDA P2P
between the processes); hpu: hccl (Ray imports ``habana_frameworks.torch.
distributed.hccl``; each worker gets its card through ``HABANA_VISIBLE_MODULES``).
xla: torch_xla runs one process per TPU chip, started by its own launcher, so
the Train run has ONE worker holding all N chips (``use_tpu=True``), which
calls ``torch_xla.launch``; each replica joins the ``xla`` process group
(``init_method="xla://"``) and gradients are averaged by ``xm.optimizer_step``
(it all-reduces when the XLA world is larger than one), after the scaler
unscaled them. Rank 0's payloads reach the Ray queue through a multiprocessing
queue. The XLA path follows torch_xla's documented API and is untested on TPU
hardware (see docs/guide/cluster.md).

Metrics are rank 0's: ``loss`` is the loss of rank 0's shard and
``images_per_sec`` its per-replica throughput (× N for the trial).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..engine.sink import Sink
from .placement import backend_of, infeasible, worker_bundles
from .replica_sync import GradSync, RecordOnlySync

#: torch.distributed backend per lossscale_bench backend
PROCESS_GROUP = {"cpu": "gloo", "cuda": "nccl", "hpu": "hccl", "xla": "xla"}
#: seconds rank 0 waits for the other replicas' end records after it finished (``LSBENCH_DIST_END_WAIT_S``)
END_WAIT_S = 120.0
#: torch.distributed collective timeout (must exceed rank 0's longest evaluation; ``LSBENCH_DIST_TIMEOUT_S``)
COLLECTIVE_TIMEOUT_S = 1800


def _end_wait_s() -> float:
    from ..core.env_vars import env_number

    return float(env_number("LSBENCH_DIST_END_WAIT_S", END_WAIT_S))


def _collective_timeout_s() -> int:
    from ..core.env_vars import env_number

    return int(env_number("LSBENCH_DIST_TIMEOUT_S", COLLECTIVE_TIMEOUT_S))


# --------------------------------------------------------------------------- worker side


class QueueSink(Sink):
    """Rank 0's sink: buffers like ``TuneSink`` and puts the same payload into a queue.

    The Tune function forwards each item with ``tune.report``, so the driver's
    ``MlflowFunnel`` sees exactly what a single-device trial would send.
    """

    def __init__(self, put: Callable[[dict], None]) -> None:
        from .tune_sink import TuneSink

        self._inner = TuneSink()
        self._put = put
        self.reports = 0

    def metrics(self, items):
        self._inner.metrics(items)

    def tags(self, tags):
        self._inner.tags(tags)

    def artifact(self, path, artifact_path=None):
        self._inner.artifact(path, artifact_path)

    def flush(self, outcome: dict | None = None):
        report = self._inner.take_report(outcome)
        if report is None:
            return
        self.reports = self._inner.reports
        self._put({"kind": "report", "final": outcome is not None, "report": report})


def param_stats(params) -> list[float]:
    """Per-tensor (sum, sum of |x|) in float64 on the host: equal lists mean equal replicas (in practice)."""
    import torch

    out: list[float] = []
    with torch.no_grad():
        for p in params:
            t = p.detach().to("cpu", torch.float64)
            out += [float(t.sum()), float(t.abs().sum())]
    return out


def drift(stats: list[list[float]]) -> float:
    """Largest difference between replicas' :func:`param_stats` (0.0: identical)."""
    if len(stats) < 2 or not stats[0]:
        return 0.0
    if any(len(s) != len(stats[0]) for s in stats):
        return float("inf")
    return max(max(col) - min(col) for col in zip(*stats))


def _train_worker(config: dict) -> None:
    """One Ray Train worker: a replica of the trial (or, for xla, the launcher of the replicas)."""
    import ray.train

    from .quiet_exit import quiet_exit_in_finalizers

    quiet_exit_in_finalizers()  # as in the Tune worker: Ray's SIGTERM at the end prints no traceback
    spec, channel = config["spec"], config["queue"]
    ctx = ray.train.get_context()
    if spec["cfg"]["resources"].get("backend") == "xla":
        return _xla_launch(spec, channel)
    _replica(spec, ctx.get_world_rank(), ctx.get_world_size(), channel, GradSync())


def _replica(spec: dict, rank: int, world: int, channel, grad_sync) -> None:
    """Run one replica; rank 0 streams its payloads and, at the end, the replicas' agreement."""
    from ..trial import run_trial

    sink = QueueSink(channel.put) if rank == 0 else Sink()
    outcome = run_trial(
        spec["cfg"],
        sink=sink,
        trial_dir=spec["trial_dir"],
        threads=spec["threads"],
        rank=rank,
        world_size=world,
        grad_sync=grad_sync,
    )
    params = getattr(grad_sync, "params", None) or []
    record = {
        "kind": "end",
        "rank": rank,
        "status": outcome.status,
        "steps": outcome.steps,
        "error": outcome.error,
        "stats": param_stats(params) if outcome.status == "finished" else [],
    }
    if rank != 0:
        channel.put(record)
        if outcome.status == "failed":
            # Let Train stop the whole group: rank 0 may be waiting in a collective for this replica.
            raise RuntimeError(f"replica {rank} failed: {outcome.error}")
        return
    # rank 0: the trial's outcome is its own; attach the replicas' agreement, then deliver it.
    wait = _end_wait_s()
    ends = channel.collect_ends(world - 1, wait)
    missing = sorted(set(range(1, world)) - {e["rank"] for e in ends})
    tags: dict[str, Any] = {"lsbench.world_size": world}
    stats = [record["stats"]] + [e["stats"] for e in sorted(ends, key=lambda e: e["rank"])]
    if outcome.status == "finished" and not missing and all(stats):
        d = drift(stats)
        tags["lsbench.replica_param_drift"] = d
        sink.metrics([("replica_param_drift", d, outcome.steps)])
    if missing:
        tags["lsbench.replicas_missing"] = ",".join(map(str, missing))
    bad = [e for e in ends if e["status"] != outcome.status]
    if bad:
        tags["lsbench.replica_status"] = "; ".join(
            f"rank {e['rank']}: {e['status']} {e['error'] or ''}".strip() for e in bad
        )[:5000]
    sink.tags(tags)
    sink.flush(outcome=outcome.to_dict())
    if missing:
        raise RuntimeError(
            f"replicas {missing} did not finish within {wait:.0f} s after rank 0; stopping the worker group"
        )


class Channel:
    """What a replica sends: reports (rank 0) go to the report queue, end records (ranks > 0) to the end queue.

    One class for both kinds of queue: Ray's (``ray.util.queue.Queue``, Train
    workers) and multiprocessing's (replicas under ``torch_xla.launch``, which
    are not Ray workers). Both ``get(timeout=...)`` and raise ``queue.Empty``
    when nothing came (Ray's ``Empty`` subclasses it).
    """

    def __init__(self, reports, ends) -> None:
        self.reports, self.ends = reports, ends

    def put(self, item: dict) -> None:
        (self.ends if item.get("kind") == "end" else self.reports).put(item)

    def collect_ends(self, n: int, wait_s: float) -> list[dict]:
        """Rank 0: the end records of ``n`` other replicas, or as many as arrive within ``wait_s``."""
        import queue

        ends: list[dict] = []
        deadline = time.time() + wait_s
        while len(ends) < n and time.time() < deadline:
            try:
                ends.append(self.ends.get(timeout=max(0.1, min(deadline - time.time(), 5.0))))
            except queue.Empty:
                continue
        return ends


# --------------------------------------------------------------------------- xla (torch_xla launcher)


def _xla_launch(spec: dict, channel) -> None:
    """Inside the single Train worker that holds all TPU chips: one process per chip via torch_xla.

    Replicas cannot use Ray handles (they are not Ray workers), so rank 0 sends
    through a multiprocessing queue that this process forwards to the Ray queues.
    """
    import multiprocessing as mp

    try:
        import torch_xla
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"backend xla: cannot import torch_xla ({exc}); see docs/guide/cluster.md") from None
    manager = mp.get_context("spawn").Manager()
    mq, ends = manager.Queue(), manager.Queue()
    done = threading.Event()

    def forward():
        import queue as _q

        while not done.is_set() or not mq.empty():
            try:
                channel.put(mq.get(timeout=0.5))
            except _q.Empty:
                continue

    t = threading.Thread(target=forward, daemon=True)
    t.start()
    try:
        torch_xla.launch(_xla_replica, args=(spec, mq, ends))
    finally:
        done.set()
        t.join(timeout=30)


def _xla_replica(index: int, spec: dict, mq, ends) -> None:
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401 - registers the "xla" process group
    import torch_xla.runtime as xr

    if not dist.is_initialized():
        dist.init_process_group("xla", init_method="xla://")
    # xm.optimizer_step averages the (already unscaled) gradients across replicas.
    _replica(spec, xr.global_ordinal(), xr.world_size(), Channel(mq, ends), RecordOnlySync())


# --------------------------------------------------------------------------- Tune side


@functools.cache
def _own_gpu_config_cls():
    """A TorchConfig whose backend does not share CUDA_VISIBLE_DEVICES across a node's workers."""
    from dataclasses import dataclass

    from ray.train.torch import TorchConfig
    from ray.train.torch.config import _TorchBackend

    class _OwnGPUBackend(_TorchBackend):
        share_cuda_visible_devices = False

    @dataclass
    class OwnGPUTorchConfig(TorchConfig):
        @property
        def backend_cls(self):
            return _OwnGPUBackend

    return OwnGPUTorchConfig


def torch_config(backend: str, pg_backend: str | None = None):
    """Ray Train's process-group setup for ``backend`` (gloo, nccl with one GPU per worker, hccl)."""
    from ray.train.torch import TorchConfig

    pg = pg_backend or ("gloo" if backend == "xla" else PROCESS_GROUP[backend])
    if backend == "cuda":
        try:  # each worker sees only its own GPU, so CUDABackend's cuda:0 is the right one
            return _own_gpu_config_cls()(backend=pg, timeout_s=_collective_timeout_s())
        except ImportError:  # pragma: no cover - Ray moved the private class; the env switch does the same
            os.environ["TRAIN_ENABLE_SHARE_CUDA_VISIBLE_DEVICES"] = "0"
    return TorchConfig(backend=pg, timeout_s=_collective_timeout_s())


def fit_streaming(
    spec: dict,
    on_item: Callable[[dict], None],
    *,
    worker_fn: Callable[[dict], None] | None = None,
    pg_backend: str | None = None,
    train_torch_config=None,
) -> BaseException | None:
    """Run the Train worker group for ``spec`` and call ``on_item`` for every queued report, live.

    ``trainer.fit()`` runs in a background thread; this thread polls the queue
    (so ``on_item`` may call ``tune.report``). Returns the exception ``fit()``
    raised, or None. ``worker_fn``, ``pg_backend`` and ``train_torch_config`` let
    tests run a probe instead of a training replica on fake devices.
    """
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Empty, Queue

    res = spec["cfg"]["resources"]
    backend = backend_of(res)
    bundles = worker_bundles(res)
    reports = Queue(actor_options={"num_cpus": 0})
    ends = Queue(actor_options={"num_cpus": 0})
    channel = Channel(reports, ends)
    scaling = ScalingConfig(
        num_workers=len(bundles),
        use_gpu=backend == "cuda",
        use_tpu=backend == "xla",
        resources_per_worker=dict(bundles[0]),
    )
    storage = os.path.join(os.path.abspath(spec["trial_dir"]), "ray_train")
    name = f"{spec['cfg']['trial_id']}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    trainer = TorchTrainer(
        worker_fn or _train_worker,
        train_loop_config={"spec": spec, "queue": channel},
        scaling_config=scaling,
        torch_config=train_torch_config or torch_config(backend, pg_backend),
        run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=0)),
    )
    box: dict[str, BaseException] = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=fit, name=f"lsbench-train-{spec['cfg']['trial_id']}", daemon=True)
    t.start()
    try:
        while True:
            try:
                on_item(reports.get(timeout=0.5))
                continue
            except Empty:
                pass
            if not t.is_alive():
                while True:  # drain what arrived after the last poll
                    try:
                        on_item(reports.get_nowait())
                    except Empty:
                        break
                break
    finally:
        t.join(timeout=5)
        for q in (reports, ends):
            try:
                q.shutdown()
            except Exception:  # noqa: BLE001
                pass
    return box.get("error")


def run_distributed_trial(spec: dict) -> None:
    """The Tune function body for a multi-device trial (called by ``tune_runner._tune_trainable``)."""
    import ray
    from ray import tune

    from .tune_sink import TuneSink

    res = spec["cfg"]["resources"]
    try:
        problem = infeasible(res, ray.cluster_resources())
    except ValueError as exc:
        problem = str(exc)
    if problem:
        sink = TuneSink()
        sink.tags({"lsbench.status": "failed", "lsbench.error": problem})
        sink.flush(outcome={"trial_id": spec["cfg"]["trial_id"], "status": "failed", "error": problem})
        return
    delivered = {"final": False}

    def on_item(item: dict) -> None:
        if item.get("kind") == "report":
            tune.report(item["report"])
            delivered["final"] |= bool(item.get("final"))

    error = fit_streaming(spec, on_item)
    if delivered["final"]:
        return  # the outcome is logged; a later worker-group error must not re-run a finished trial
    if error is not None:
        raise RuntimeError(f"multi-device trial {spec['cfg']['trial_id']} failed: {error}") from error
    raise RuntimeError(f"multi-device trial {spec['cfg']['trial_id']}: rank 0 ended without an outcome")
