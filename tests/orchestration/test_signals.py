"""SIGTERM / Ctrl-C end a study's runs as KILLED and a re-run resumes; ``lsbench ui`` stops its server.

Real processes and real signals: ``lsbench run`` / ``lsbench ui`` as subprocesses,
a real Ray driver, a real ``mlflow server``; processes are found through /proc
(no psutil), by parent pid and process group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_resume import STUDY, _checkpoints, _cmd

CLI = [sys.executable, "-m", "lossscale_bench.cli"]


def _procs() -> list[tuple[int, int, int, str]]:
    """(pid, ppid, pgid, state) of every live process, from /proc/<pid>/stat."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
        out.append((int(d.name), int(rest[1]), int(rest[2]), rest[0]))
    return out


def _alive(pid: int) -> bool:
    return any(p == pid and state != "Z" for p, _, _, state in _procs())


def _group(pgid: int) -> list[int]:
    return [p for p, _, g, state in _procs() if g == pgid and state != "Z"]


def _runs(runs: Path, name: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    trials = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    parents = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'study'")
    return client, trials, parents


@pytest.mark.slow
def test_sigterm_ends_runs_killed_and_the_same_command_resumes(tmp_path):
    study = tmp_path / "resume.yaml"
    study.write_text(STUDY.replace("iterations: 400", "iterations: 100"))
    runs = tmp_path / "runs"
    # one CPU: the two trials run one after the other, so the signal lands mid-study
    proc = subprocess.Popen(
        _cmd(study, runs),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not _checkpoints(runs) and proc.poll() is None:
            time.sleep(0.3)
        assert _checkpoints(runs), "no checkpoint appeared"
        ck = _checkpoints(runs)[0]
        worker = int((ck.parent / "pid").read_text())
        os.kill(proc.pid, signal.SIGTERM)  # the driver only, as a scheduler or `kill` does
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, (proc.returncode, out[-2000:], err[-8000:])
    assert "interrupted by SIGTERM" in err and "marked KILLED" in err, err[-2000:]
    assert not _alive(worker), "the Ray trial process outlived the driver"
    client, trials, (parent,) = _runs(runs, "resume")
    assert len(trials) == 2
    # nothing left RUNNING: the running trial and the one not started yet are KILLED, resumable
    assert {t.info.status for t in trials} == {"KILLED"}, [(t.info.status, t.data.tags) for t in trials]
    assert {t.data.tags["lsbench.status"] for t in trials} == {"interrupted"}
    assert parent.info.status == "KILLED"

    r = subprocess.run(_cmd(study, runs), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    client, trials, (parent,) = _runs(runs, "resume")
    assert len(trials) == 2 and parent.info.status == "FINISHED"
    assert {(t.info.status, t.data.tags["lsbench.status"]) for t in trials} == {("FINISHED", "finished")}
    resumed = [t for t in trials if t.data.tags["lsbench.trial_id"] == ck.parent.name][0]
    assert int(resumed.data.tags["lsbench.resumed_from_step"]) >= 20
    steps = {m.step for m in client.get_metric_history(resumed.info.run_id, "loss")}
    assert steps == set(range(1, 101))  # continued from its checkpoint, no gap


def test_ctrl_c_in_the_local_executor_exits_130_with_runs_killed(tmp_path):
    study = tmp_path / "resume.yaml"
    study.write_text(STUDY.replace("iterations: 400", "iterations: 100"))
    runs = tmp_path / "runs"
    cmd = _cmd(study, runs) + ["--executor", "local"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not _checkpoints(runs) and proc.poll() is None:
            time.sleep(0.3)
        assert _checkpoints(runs), "no checkpoint appeared"
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (out[-2000:], err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    _, trials, (parent,) = _runs(runs, "resume")
    assert {(t.info.status, t.data.tags["lsbench.status"]) for t in trials} == {("KILLED", "interrupted")}
    assert parent.info.status == "KILLED"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_on_a_busy_port_is_one_line_exit_2_and_starts_nothing(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.Popen(
            CLI + ["ui", "--port", str(port), "--runs-dir", str(tmp_path / "runs")],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        children = [p for p, ppid, _, _ in _procs() if ppid == proc.pid]
    assert proc.returncode == 2, (out, err)
    assert err.strip().splitlines() == [err.strip()] and f"port {port} is in use" in err, err
    assert not children


@pytest.mark.slow
def test_sigterm_to_ui_stops_the_whole_server(tmp_path):
    import urllib.request

    port = _free_port()
    proc = subprocess.Popen(
        CLI + ["ui", "--port", str(port), "--runs-dir", str(tmp_path / "runs")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline, up = time.time() + 120, False
        while time.time() < deadline and proc.poll() is None and not up:
            try:
                up = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).status == 200
            except OSError:
                time.sleep(0.5)
        assert up, "the MLflow server did not answer"
        (server,) = [p for p, ppid, _, _ in _procs() if ppid == proc.pid]
        members = _group(server)  # the server leads a group of its own with its workers
        assert server in members and len(members) > 1, members
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, (out, err[-3000:])
    assert not _group(server), "server processes outlived lsbench ui"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)


def test_a_server_that_dies_early_is_one_line_and_leaves_no_workers(capsys):
    """``mlflow server`` losing the port race (bound between the check and its start) exits 1 with
    uvicorn's traceback while its job-runner workers live on; ``serve`` names the cause and
    stops the whole group. A stand-in server: one lingering worker, the bind error, exit 1."""
    from lossscale_bench.tracking.ui_server import serve as _serve

    fake = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('worker', flush=True); time.sleep(0.5); "
        "sys.stderr.write('OSError: [Errno 98] error while attempting to bind: address already in use\\n'); "
        "sys.exit(1)"
    )
    before = {p for p, *_ in _procs()}
    rc = _serve([sys.executable, "-c", fake], 5123)
    err = capsys.readouterr().err
    assert rc == 2 and "lsbench: error: the MLflow server exited with code 1: port 5123 is in use" in err, err

    def cmdline(pid):
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return ""

    leftover = [p for p, _, _, state in _procs() if p not in before and state != "Z" and "time.sleep(60)" in cmdline(p)]
    assert not leftover
