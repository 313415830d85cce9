"""A Ray cluster that loses a node: a head and two worker nodes, each its own ``ray start`` process.

The study joins the cluster with ``--address`` and writes to the session's ``mlflow server``. While its
trial trains on a worker node, that node is killed (its ``ray start``, raylet, agents and worker
processes, SIGKILL): Tune retries the trial (``FailureConfig(max_failures)``, the study's ``max_failures``)
on the surviving worker, which resumes from the trial's checkpoint. The checkpoint is lsbench's own,
``<runs-dir>/<study>/trials/<trial>/checkpoint.pt``, not a Ray checkpoint in ``storage_path``: the runs
folder must be the same folder on every node (here it is, being one machine), which this test checks by
the checkpoint's place and the retried attempt's ``lsbench.resumed_from_step``.

The cluster is started with the command lines of docs/guide/team-setup.md (tests/servers.py), on free
ports, with a ``--temp-dir`` of its own, and stopped by its processes, never with ``ray stop``.
"""

from __future__ import annotations

import time

import pytest
import servers
from servers import assert_same_history, finish, history, run_env, start_run, wait_checkpoint

pytestmark = pytest.mark.skipif(servers.postgres_missing() is not None, reason=str(servers.postgres_missing()))

#: the page's cluster command with what the tests add: no report at the end, no progress lines
CLUSTER_FLAGS = ("--no-report", "--quiet")


@pytest.fixture
def cluster(tmp_path):
    c = servers.RayCluster(tmp_path / "ray")
    try:
        c.start_head()
        c.wait_nodes(1)  # a worker started before the head's GCS is up fails to join (seen: InvalidAuthToken)
        c.add_worker()
        c.add_worker()
        c.wait_nodes(3)
        yield c
    finally:
        c.stop()


def _trial_pid(ck) -> int:
    return int((ck.parent / "pid").read_text())


def test_worker_node_lost_mid_trial_the_study_finishes_as_if_nothing_happened(
    cluster, mlflow_server, reference, tmp_path
):
    from mlflow.tracking import MlflowClient

    env = {**run_env(tmp_path, "team-node-loss", mlflow_server.env), "RAY_PORT": str(cluster.port)}
    proc = start_run("run_cluster", env, tmp_path / "run.log", CLUSTER_FLAGS)
    ck = wait_checkpoint(env, proc)
    assert ck.is_relative_to(env["RUNS"])  # lsbench's checkpoint, in the (shared) runs folder
    node = cluster.node_of(_trial_pid(ck))
    assert node in cluster.workers, "the trial does not run on a worker node"
    killed = cluster.kill_node(node)
    assert _trial_pid(ck) in killed
    rc, err = finish(proc)
    assert rc == 0, err[-3000:]
    assert_same_history(history(mlflow_server.uri, "team-node-loss"), reference["history"])
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    exp = client.get_experiment_by_name("team-node-loss")
    (run,) = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    assert int(run.data.tags["lsbench.resumed_from_step"]) >= 30 and "lsbench.retries" in run.data.tags
    survivor = next(p for p in cluster.workers if p is not node)
    assert servers.group_alive(survivor.pid)
    # the report is the uninterrupted study's, but for the study's name
    tables = {}
    for name, e in (("team-node-loss", env), ("team-reference", reference["env"])):
        out = tmp_path / "reports" / name
        out.mkdir(parents=True)
        r = servers.run("report_server", {**e, "OUT": str(out / "r.md")}, timeout=600, cwd=out)
        assert r.returncode == 0, r.stderr[-3000:]
        tables[name] = (out / "r.md").read_text().replace(name, "STUDY")
    assert tables["team-node-loss"] == tables["team-reference"]


def test_head_node_lost_the_driver_stops_with_one_line_and_a_new_cluster_continues(
    cluster, mlflow_server, reference, tmp_path
):
    env = {**run_env(tmp_path, "team-head-loss", mlflow_server.env), "RAY_PORT": str(cluster.port)}
    proc = start_run("run_cluster", env, tmp_path / "run.log", CLUSTER_FLAGS)
    wait_checkpoint(env, proc)
    t0 = time.monotonic()
    cluster.kill_node(cluster.head)
    rc, err = finish(proc, timeout=600)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 4 and len(lines) == 1 and "Ray" in lines[0], (rc, time.monotonic() - t0, err[-3000:])
    for w in list(cluster.workers):
        cluster.kill_node(w)
    fresh = servers.RayCluster(tmp_path / "ray2")
    try:
        fresh.start_head()
        fresh.wait_nodes(1)
        fresh.add_worker()
        fresh.wait_nodes(2)
        rc, err = finish(start_run("run_cluster", {**env, "RAY_PORT": str(fresh.port)}, tmp_path / "rerun.log"))
        assert rc == 0, err[-3000:]
    finally:
        fresh.stop()
    assert_same_history(history(mlflow_server.uri, "team-head-loss"), reference["history"])
