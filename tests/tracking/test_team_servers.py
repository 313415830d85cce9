"""A team's store, for real: PostgreSQL, and ``mlflow server`` on it with an artifact store of its own.

Before: with ``--tracking-uri http://...`` the study's experiment was created with a ``file://`` artifact
location in the driver's runs folder; the server's artifact store received no file, and a report made
where the driver's disk is not (another machine, or the runs folder deleted) drew no heatmap. Now the
experiment takes the server's location (``mlflow-artifacts:``) and every artifact goes through the server.

The faults of a team's day, on both stores (PostgreSQL direct, and behind the server): two drivers of two
studies at once, one of them killed with SIGKILL, the store restarted while the other runs; the reruns leave
one run per trial and the metric history of an uninterrupted run. The servers are started by the fixtures
of ``tests/servers.py`` with the command lines of docs/guide/team-setup.md (checked here too).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import servers
from servers import assert_same_history, checkpoint, finish, history, run_env, start_run, wait_checkpoint

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "guide" / "team-setup.md"


def _one_line_store_error(rc: int, err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 4 and len(lines) == 1 and lines[0].startswith("lsbench: error:"), (rc, err[-3000:])


def test_team_setup_page_gives_the_commands_the_tests_run():
    text = PAGE.read_text()
    missing = [name for name, cmd in servers.COMMANDS.items() if cmd not in text]
    assert not missing, f"commands the tests run that {PAGE.name} does not give: {missing}"


def test_a_new_study_on_a_server_keeps_its_artifacts_in_the_servers_store(mlflow_server, tmp_path):
    """Before: ``file://<runs-dir>/artifacts/<study>``, the driver's disk, which the server never sees."""
    from lossscale_bench.tracking import Tracker

    tracker = Tracker(mlflow_server.uri, artifact_root=tmp_path / "runs" / "artifacts")
    exp = tracker.client.get_experiment(tracker.experiment_id("team-location"))
    assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
    chosen = Tracker(mlflow_server.uri, artifacts_uri=str(tmp_path / "shared"))
    exp = chosen.client.get_experiment(chosen.experiment_id("team-location-chosen"))
    assert exp.artifact_location == (tmp_path / "shared" / "team-location-chosen").as_uri()


_OPEN = """
import sys
from lossscale_bench.tracking.tracker import Tracker
Tracker(sys.argv[1]).experiment_id(sys.argv[2])
"""


def test_drivers_opening_one_new_database_together_wait_while_one_makes_its_tables(postgres):
    """Before: drivers opening a new PostgreSQL database at once all made MLflow's tables; a loser got
    duplicate key "pg_type_typname_nsp_index" and its study exited having trained nothing (one open in 18,
    three at a time). Now each waits on the server's advisory lock: held here, three openers queue on it and
    no table appears; released, all three open the one set of tables."""
    import sqlalchemy

    from lossscale_bench.tracking.store_open import schema_lock

    uri = postgres.createdb(f"race_{os.getpid()}")
    engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool)
    waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    with schema_lock(uri) as held:
        assert held
        procs = [
            subprocess.Popen([sys.executable, "-c", _OPEN, uri, f"race-{i}"], stderr=subprocess.PIPE, text=True)
            for i in range(3)
        ]
        deadline, queued = time.monotonic() + 300, 0
        while queued < 3 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.5)
            with engine.connect() as conn:
                queued = conn.execute(sqlalchemy.text(waiting)).scalar()
        assert queued == 3, (queued, [p.poll() for p in procs])
        assert sqlalchemy.inspect(engine).get_table_names() == []
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e[-1500:] for e in errors]
    with engine.connect() as conn:
        names = conn.execute(sqlalchemy.text("SELECT name FROM experiments")).scalars().all()
    assert sorted(n for n in names if n.startswith("race-")) == ["race-0", "race-1", "race-2"]
    engine.dispose()


def _report(command: str, env: dict, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The page's report command, run in the folder ``out`` and writing there (``extra``: more options)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**env, "OUT": str(out)}
    return subprocess.run(
        ["bash", "-c", " ".join([servers.shell(command, env), *extra])],
        env=env, capture_output=True, text=True, timeout=600, cwd=out,
    )  # fmt: skip


def test_server_keeps_every_artifact_and_a_report_elsewhere_is_the_same(mlflow_server, reference, tmp_path):
    from mlflow.tracking import MlflowClient

    env = reference["env"]
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    exp = client.get_experiment_by_name("team-reference")
    assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
    stored = {p.name for p in (mlflow_server.artifacts / exp.experiment_id).rglob("*") if p.is_file()}
    assert {"layers_history.csv", "loss.png", "team-reference.yaml"} <= stored, stored
    # the driver's runs folder keeps only what unfinished trials resume from: nothing, once all finished
    assert not [p for p in (Path(env["RUNS"]) / "team-reference" / "trials").rglob("*") if p.is_file()]
    first = _report("report_server", env, tmp_path / "here")
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(env["RUNS"])  # the driver's disk is gone: what remains is on the server
    second = _report("report_server", env, tmp_path / "elsewhere")
    assert second.returncode == 0, second.stderr[-3000:]
    md1, md2 = (tmp_path / d / "team-reference.md" for d in ("here", "elsewhere"))
    assert md1.read_text() == md2.read_text()
    assert "underflow-rate heatmap" in md2.read_text()
    pngs = sorted(p.name for p in (tmp_path / "elsewhere").glob("*.png"))
    assert pngs == sorted(p.name for p in (tmp_path / "here").glob("*.png")) and any("underflow" in p for p in pngs)
    tele = _report("report_server", env, tmp_path / "telemetry", "--telemetry")
    assert tele.returncode == 0, tele.stderr[-3000:]
    assert "flush" in (tmp_path / "telemetry" / "team-reference_telemetry.md").read_text()


def _restart_postgres(pg) -> None:
    subprocess.run(["bash", "-c", servers.shell("pg_stop", pg.env)], env=pg.env, check=True, timeout=120)
    time.sleep(1.0)
    pg.start()


def _restart_server(server) -> None:
    server.stop()
    server.start()


@pytest.mark.parametrize("store", ["postgresql", "server"])
def test_two_drivers_a_kill_and_a_restart_lose_nothing(store, postgres, mlflow_server, reference, tmp_path):
    """Two studies at once on one store; driver A is killed (SIGKILL) after its first checkpoint, then the
    store restarts while B trains; B ends (exit 0, or exit 4 with one line: then rerun), A is rerun."""
    if store == "postgresql":
        base = {**postgres.env, "DB": f"team_{os.getpid()}"}
        uri = postgres.createdb(base["DB"])
        command, restart = "run_database", lambda: _restart_postgres(postgres)
    else:
        base, uri = mlflow_server.env, mlflow_server.uri
        command, restart = "run_server", lambda: _restart_server(mlflow_server)
    a = run_env(tmp_path, f"team-{store}-a", base)
    b = run_env(tmp_path, f"team-{store}-b", base)
    if store == "server":  # B's experiment as lsbench made it before: its artifacts on the driver's disk
        from mlflow.tracking import MlflowClient

        location = (Path(b["RUNS"]) / "artifacts" / b["NAME"]).as_uri()
        MlflowClient(tracking_uri=uri).create_experiment(b["NAME"], artifact_location=location)
    pa = start_run(command, a, tmp_path / "a.log")
    pb = start_run(command, b, tmp_path / "b.log")
    wait_checkpoint(a, pa)
    os.killpg(pa.pid, signal.SIGKILL)
    pa.wait(timeout=60)
    wait_checkpoint(b, pb)
    restart()
    rc, err = finish(pb)
    if rc != 0:  # the store was away longer than the client retries: one line, and the rerun continues
        _one_line_store_error(rc, err)
        rc, err = finish(start_run(command, b, tmp_path / "b2.log"))
        assert rc == 0, err[-3000:]
    rc, err = finish(start_run(command, a, tmp_path / "a2.log"))
    assert rc == 0, err[-3000:]
    for env in (a, b):
        assert_same_history(history(uri, env["NAME"]), reference["history"])
    # a report from a second folder is the first one's
    report = "report_database" if store == "postgresql" else "report_server"
    for env in (a, b):  # B's store made by the earlier code reports too
        one, two = (_report(report, env, tmp_path / env["NAME"] / d) for d in ("one", "two"))
        assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
        md = [(tmp_path / env["NAME"] / d / f"{env['NAME']}.md").read_text() for d in ("one", "two")]
        assert md[0] == md[1] and "underflow-rate heatmap" in md[0]


# ------------------------------------------------------------------------------------------------ a lost node
def _trial_node(cluster: servers.RayCluster) -> subprocess.Popen | None:
    """The worker node whose Ray worker process is running the trial (its process title is the trainable's
    method, ``ray::ImplicitFunc.train`` and the like; idle workers are ``ray::IDLE``)."""
    for node in cluster.workers:
        for pid in servers.descendants(node.pid):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if title.startswith("ray::") and "IDLE" not in title and "train" in title.lower():
                return node
    return None


def test_a_worker_node_killed_mid_trial_is_retried_on_another_from_its_checkpoint(mlflow_server, reference, tmp_path):
    """A head and two worker nodes, each its own ``ray start``; the page's ``lsbench run --address``; once the
    trial has a checkpoint, the node running it is killed (its raylet and workers, SIGKILL). The trial is
    retried on the other node from that checkpoint, the study ends (exit 0) and its history is an
    uninterrupted run's: one run, no step lost or logged twice, nothing left RUNNING."""
    cluster = _cluster(tmp_path / "ray", workers=2)
    try:
        env = run_env(tmp_path, "team-node-loss", {**mlflow_server.env, **cluster.env()})
        proc = start_run("run_cluster", env, tmp_path / "run.log", flags=("--no-report", "--quiet"))
        wait_checkpoint(env, proc)
        deadline = time.monotonic() + 120
        node = _trial_node(cluster)
        while node is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            node = _trial_node(cluster)
        assert node is not None, "no worker node runs the trial"
        cluster.kill_node(node)
        rc, err = finish(proc)
        assert rc == 0, err[-3000:]
        got = history(mlflow_server.uri, "team-node-loss")
        assert_same_history(got, reference["history"])
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=mlflow_server.uri)
        exp = client.get_experiment_by_name("team-node-loss")
        (run,) = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
        assert int(run.data.tags.get("lsbench.resumed_from_step", 0)) > 0, run.data.tags  # from the checkpoint
    finally:
        cluster.stop()


def _cluster(root: Path, workers: int) -> servers.RayCluster:
    """A head and ``workers`` worker nodes, each its own ``ray start``, all counted by the head."""
    cluster = servers.RayCluster(root)
    cluster.start_head()
    cluster.wait_nodes(1)
    for alive in range(2, workers + 2):  # one after another: two joining at once timed out ("Failed to get node info")
        cluster.add_worker()
        cluster.wait_nodes(alive)
    return cluster


def test_the_head_node_killed_mid_study_is_one_line_and_a_new_cluster_continues(mlflow_server, tmp_path):
    """The head of the cluster killed (SIGKILL) while its trial trains: the driver stops with one line, exit 4;
    the same command against a new cluster continues the trial from its checkpoint: one run, every step once.
    (A trial five times the others' length: the 120-step one had ended by the time its first checkpoint was
    seen, so the head died with nothing running.)"""
    iterations = 600
    cluster = _cluster(tmp_path / "ray1", workers=1)
    try:
        env = run_env(tmp_path, "team-head-loss", {**mlflow_server.env, **cluster.env()}, iterations=iterations)
        proc = start_run("run_cluster", env, tmp_path / "run.log", flags=("--no-report", "--quiet"))
        wait_checkpoint(env, proc)
        assert _trial_node(cluster) is not None, "the trial is not running"
        cluster.kill_node(cluster.head)
        rc, err = finish(proc, timeout=300)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 4 and len(lines) == 1 and lines[0].startswith("lsbench: error:"), (rc, err[-3000:])
    finally:
        cluster.stop()
    # what the checkpoints need is the runs folder: Tune's own storage (its experiment state) is deleted here,
    # and the trial still resumes from lsbench's checkpoint in <runs>/<study>/trials/<id>/
    tune_storage = Path(env["RUNS"]) / env["NAME"] / "ray"
    assert tune_storage.is_dir() and checkpoint(env) is not None
    shutil.rmtree(tune_storage)
    cluster = _cluster(tmp_path / "ray2", workers=1)
    try:
        env = {**env, **cluster.env()}
        rc, err = finish(start_run("run_cluster", env, tmp_path / "rerun.log", flags=("--no-report", "--quiet")))
        assert rc == 0, err[-3000:]
        got = history(mlflow_server.uri, "team-head-loss")  # every trial run FINISHED, checked there
        assert (got["studies"], got["trial_runs"]) == (1, 1)
        (metrics,) = got["trials"].values()
        assert [s for s, _ in metrics["loss"]] == list(range(1, iterations + 1))  # none lost, none twice
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=mlflow_server.uri)
        exp = client.get_experiment_by_name("team-head-loss")
        (run,) = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
        assert int(run.data.tags.get("lsbench.resumed_from_step", 0)) > 0, run.data.tags
    finally:
        cluster.stop()
