"""A team's servers, started by the tests: PostgreSQL, ``mlflow server`` on it, a Ray cluster of separate nodes.

The command lines are the ones docs/guide/team-setup.md gives, word for word: :data:`COMMANDS` holds them
as shell text with ``$NAME`` placeholders, each is run through ``bash -c`` with the placeholders in the
environment, and ``tests/tracking/test_team_servers.py`` checks that every one of them is on the page.
Everything lives in a temporary folder (data, sockets, logs, Ray's ``--temp-dir``) on free ports, so the
servers of others on this machine are never touched; each is stopped by the process group it was started
in, never by name (``ray stop`` would stop every Ray on the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import study_yaml


def _pgbin() -> str:
    """$PGBIN, else the newest ``/usr/lib/postgresql/<version>/bin`` holding initdb (Debian's package puts the
    server there, not on PATH; 15 on this machine)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0
    )
    return os.environ.get("PGBIN") or (str(found[-1].parent) if found else "/usr/lib/postgresql/15/bin")


#: the PostgreSQL server's programs (initdb, pg_ctl, createdb)
PGBIN = _pgbin()

#: the page's commands, in the order the page gives them (``$NAME``: an environment variable)
COMMANDS = {
    "initdb": 'su postgres -c "$PGBIN/initdb -D $PGDATA -A trust -U postgres"',
    "pg_start": (
        'su postgres -c "$PGBIN/pg_ctl -D $PGDATA -l $PGLOG -w '
        "-o '-p $PGPORT -k $PGSOCK -c listen_addresses=127.0.0.1' start\""
    ),
    "createdb": "$PGBIN/createdb -h 127.0.0.1 -p $PGPORT -U postgres $DB",
    "pg_stop": 'su postgres -c "$PGBIN/pg_ctl -D $PGDATA -w stop -m fast"',
    "mlflow_server": (
        "mlflow server --backend-store-uri postgresql://postgres@127.0.0.1:$PGPORT/mlflow "
        "--artifacts-destination $ARTIFACTS --host 127.0.0.1 --port $MLFLOW_PORT --workers 2"
    ),
    "mlflow_basic_auth": (
        "mlflow server --app-name basic-auth --backend-store-uri sqlite:///$AUTH_DIR/mlflow.db "
        "--artifacts-destination $ARTIFACTS --host 127.0.0.1 --port $MLFLOW_PORT --workers 1"
    ),
    "ray_head": (
        "ray start --head --node-ip-address $HEAD_IP --port $RAY_PORT --num-cpus 0 "
        "--include-dashboard false --dashboard-port $DASHBOARD_PORT --temp-dir $RAY_TMP --disable-usage-stats --block $RAY_PORTS"
    ),
    "ray_worker": (
        "ray start --address $HEAD_IP:$RAY_PORT --node-ip-address $NODE_IP --num-cpus 1 "
        "--resources '{\"lsbench_worker\": 1}' --disable-usage-stats --block $RAY_PORTS"
    ),
    "run_server": "lsbench run $STUDY --tracking-uri http://127.0.0.1:$MLFLOW_PORT --runs-dir $RUNS",
    "run_database": "lsbench run $STUDY --tracking-uri postgresql://postgres@127.0.0.1:$PGPORT/$DB --runs-dir $RUNS",
    "run_cluster": (
        "lsbench run $STUDY --tracking-uri http://127.0.0.1:$MLFLOW_PORT --runs-dir $RUNS --address $HEAD_IP:$RAY_PORT"
    ),
    "report_server": "lsbench report --study $NAME --tracking-uri http://127.0.0.1:$MLFLOW_PORT --out $OUT",
    "report_database": "lsbench report --study $NAME --tracking-uri postgresql://postgres@127.0.0.1:$PGPORT/$DB --out $OUT",
}
#: the same commands with the folder of this interpreter first on PATH (its mlflow, ray) and lsbench as a module
VENV_BIN = str(Path(sys.executable).parent)


def free_port() -> int:
    """A port nothing listens on now (bound to 0, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shell(name: str, env: dict[str, str]) -> str:
    """The shell text of :data:`COMMANDS` ``[name]`` as the tests run it: ``lsbench`` is this interpreter's
    module, ``su postgres -c`` is left out where the tests do not run as root (PostgreSQL refuses root)."""
    cmd = COMMANDS[name]
    if cmd.startswith("lsbench "):
        cmd = f'"{sys.executable}" -m lossscale_bench.cli' + cmd[len("lsbench") :]
    if cmd.startswith("su postgres -c ") and os.geteuid() != 0:
        cmd = cmd[len("su postgres -c ") :].strip('"')
    return cmd


def environment(**values) -> dict[str, str]:
    """This process's environment with the placeholders set and this interpreter's bin folder first on PATH."""
    env = {**os.environ, **{k: str(v) for k, v in values.items()}}
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["PGBIN"] = PGBIN
    return env


def run(name: str, env: dict[str, str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run :data:`COMMANDS` ``[name]`` to its end; its output is captured as text."""
    return subprocess.run(
        ["bash", "-c", shell(name, env)], env=env, capture_output=True, text=True, timeout=timeout, **kw
    )


def start(name: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start :data:`COMMANDS` ``[name]`` in a process group of its own, output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            ["bash", "-c", "exec " + shell(name, env)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 60) -> None:
    """Signal ``proc``'s whole process group (the server and what it started) and wait for ``proc``."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` still runs."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (by parent pid, whatever their process group)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        c, p = map(int, line.split())
        children.setdefault(p, []).append(c)
    seen, todo = [], [pid]
    while todo:
        cur = todo.pop()
        seen.append(cur)
        todo.extend(children.get(cur, []))
    return seen


# ------------------------------------------------------------------------------------------------ PostgreSQL
def postgres_missing() -> str | None:
    """Why PostgreSQL cannot run here (None when it can): its binaries or the postgres user are absent."""
    if not (Path(PGBIN) / "initdb").is_file():
        return f"no PostgreSQL server binaries in {PGBIN} (apt-get install -y postgresql)"
    if os.geteuid() == 0 and shutil.which("su") is None:
        return "running as root without su: the PostgreSQL server refuses to run as root"
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        if os.geteuid() == 0:
            return "no postgres user (apt-get install -y postgresql creates it)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "no psycopg (pip install 'psycopg[binary]', the dev extra): SQLAlchemy 2.1's postgresql:// driver"
    return None


class Postgres:
    """One PostgreSQL server in ``root`` (data, socket, log), on a free port, as the page starts it."""

    def __init__(self, root: Path | None = None) -> None:
        # not under pytest's tmp folders: a pytest started beside this one makes /tmp/pytest-of-<user> 0700
        # again, and the server (another user) loses its data folder mid-test (seen: PANIC, pg_control)
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="lsbench-pg-", dir="/tmp"))
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # the postgres user must reach its data, socket and log folders
        self.sock = self.root / "sock"
        self.sock.mkdir(exist_ok=True)
        os.chmod(self.sock, 0o777)
        self.port = free_port()
        self.env = environment(
            PGDATA=self.root / "data", PGLOG=self.root / "postgres.log", PGPORT=self.port, PGSOCK=self.sock
        )
        self.start_s: float | None = None
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.sock, "postgres")

    def _check(self, r: subprocess.CompletedProcess, what: str) -> None:
        if r.returncode != 0:
            log = Path(self.env["PGLOG"])
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{what} failed ({r.returncode}): {r.stdout[-1500:]} {r.stderr[-1500:]} {tail}")

    def init(self) -> None:
        self._check(run("initdb", self.env), "initdb")

    def start(self) -> None:
        t0 = time.monotonic()
        self._check(run("pg_start", self.env), "pg_ctl start")
        self.start_s = time.monotonic() - t0

    def stop(self) -> None:
        run("pg_stop", self.env)

    def remove(self) -> None:
        """Stop it and delete its folder."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def createdb(self, name: str) -> str:
        """A new database ``name``; its URI as users write it (``postgresql://user@host:port/db``)."""
        self._check(run("createdb", {**self.env, "DB": name}), f"createdb {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"


# ------------------------------------------------------------------------------------------------ mlflow server
class MlflowServer:
    """``mlflow server`` on the database ``mlflow`` of ``pg`` with its artifacts in ``artifacts``."""

    def __init__(self, pg: Postgres, artifacts: Path, log: Path) -> None:
        self.pg, self.artifacts, self.log = pg, Path(artifacts), Path(log)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.env = {**pg.env, "ARTIFACTS": str(self.artifacts), "MLFLOW_PORT": str(self.port)}
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None

    def start(self, timeout: float = 480) -> None:
        """Start it and wait until ``/health`` answers (15-30 s on 2 idle cores; 90-160 s measured on 2 cores
        shared by several test runs)."""
        t0 = time.monotonic()
        self.proc = start("mlflow_server", self.env, self.log)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        self.start_s = time.monotonic() - t0
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not up after {timeout} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM to its group (the parent stops its workers), SIGKILL if it lingers."""
        if self.proc is not None:
            kill_group(self.proc, signal.SIGTERM, timeout=30)
            self.proc = None


# ------------------------------------------------------------------------------------------------ Ray cluster
def node_ports() -> str:
    """Free ports for every listener of one Ray node (Ray's defaults are fixed ports others may use)."""
    names = (
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    )
    return " ".join(f"--{n} {free_port()}" for n in names)


def machine_ip() -> str:
    """This machine's address as Ray finds it (the interface a UDP socket would leave by; nothing is sent).

    Not 127.0.0.1: a driver that joins ``127.0.0.1:<port>`` has it rewritten to this address by Ray
    (``resolve_ip_for_localhost``), and a cluster started with ``--node-ip-address 127.0.0.1`` is then not
    found there (measured: "Failed to connect to Ray cluster at 192.0.2.2:<port>")."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("8.8.8.8", 80))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class RayCluster:
    """A head (no CPUs: trials never run there) and worker nodes of 1 CPU each, separate ``ray start`` processes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.ip = machine_ip()
        self.address = f"{self.ip}:{self.port}"
        # Ray's socket paths must stay under 107 bytes: a short temp dir of its own
        self.tmp = Path(subprocess.check_output(["mktemp", "-d", "/tmp/lsr-XXXXXX"], text=True).strip())
        self.head: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    def env(self) -> dict[str, str]:
        """The environment its commands run in: its ports, its temp folder, this machine's address, token auth."""
        ports = node_ports()
        # Ray 2.60's `ray start --head` turns token authentication on and writes ~/.ray/auth_token; a node
        # or driver that joins must say RAY_AUTH_MODE=token, or it is refused (InvalidAuthToken)
        return environment(
            RAY_PORT=self.port,
            RAY_TMP=self.tmp,
            RAY_PORTS=ports,
            HEAD_IP=self.ip,
            NODE_IP=self.ip,
            RAY_AUTH_MODE="token",
        )

    def start_head(self) -> None:
        env = self.env()
        env["DASHBOARD_PORT"] = str(free_port())
        self.head = start("ray_head", env, self.root / "head.log")

    def add_worker(self) -> subprocess.Popen:
        n = len(self.workers)
        proc = start("ray_worker", self.env(), self.root / f"worker{n}.log")
        self.workers.append(proc)
        return proc

    def wait_nodes(self, alive: int, timeout: float = 600) -> None:
        """Until ``alive`` nodes are alive (asked through a short-lived driver process)."""
        code = (
            "import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR', include_dashboard=False);"
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        deadline = time.monotonic() + timeout
        seen = ""
        while time.monotonic() < deadline:
            try:
                r = subprocess.run(
                    [sys.executable, "-c", code, self.address],
                    capture_output=True, text=True, timeout=300, env=self.env(),
                )  # fmt: skip
            except subprocess.TimeoutExpired:  # a loaded machine: the probe's own Ray start is slow
                continue
            seen = r.stdout.strip().splitlines()[-1:] or r.stderr[-500:]
            if r.returncode == 0 and seen == [str(alive)]:
                return
            time.sleep(1)
        raise RuntimeError(f"Ray cluster at {self.address}: not {alive} nodes alive after {timeout} s ({seen})")

    def kill_node(self, proc: subprocess.Popen) -> list[int]:
        """SIGKILL one node: its ``ray start``, raylet and its side processes (one process group) and its workers
        (the raylet's children, each in a session of its own); returns the pids killed."""
        pids = descendants(proc.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kill_group(proc)
        return pids

    def node_of(self, pid: int) -> subprocess.Popen | None:
        """The node (its ``ray start`` process) whose process tree holds ``pid``."""
        for proc in [*self.workers, *([self.head] if self.head else [])]:
            if pid in descendants(proc.pid):
                return proc
        return None

    def stop(self) -> None:
        for proc in [*self.workers, *([self.head] if self.head else [])]:
            self.kill_node(proc)
        self.workers, self.head = [], None
        shutil.rmtree(self.tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ fixtures
# imported by tests/conftest.py: one PostgreSQL and one mlflow server for the whole test session


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A PostgreSQL server for the session (skipped, with the reason, where it cannot run here)."""
    why = postgres_missing()
    if why:
        pytest.skip(why)
    pg = Postgres()
    try:
        pg.init()
        pg.start()
        print(f"\nPostgreSQL started in {pg.start_s:.1f} s")
        yield pg
    finally:
        pg.remove()


@pytest.fixture(scope="session")
def mlflow_server(postgres, tmp_path_factory):
    """``mlflow server`` on the session's PostgreSQL (database ``mlflow``), artifacts in a folder of its own."""
    root = tmp_path_factory.mktemp("mlflow-server")
    postgres.createdb("mlflow")
    server = MlflowServer(postgres, root / "artifacts", root / "server.log")
    server.start()
    print(f"\nmlflow server up in {server.start_s:.1f} s")
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------ the team study
#: what the tests add to the page's `lsbench run` lines: one trial at a time in the driver (no Ray to start:
#: the store is what these tests are about), no report at the end, no progress lines
TEST_FLAGS = ["--executor", "local", "--no-report", "--quiet"]
#: metrics that depend on the machine's speed and memory, not on the training
MACHINE_METRICS = ("images_per_sec", "host_")


def team_study(name: str, iterations: int = 120) -> str:
    """One fp16-emulated trial long enough to be killed between checkpoints (every 30 of 120 steps)."""
    return study_yaml(
        name=name,
        precision="fp16-emulated",
        scaling=["{method: fixed, scale: 128}"],
        schedule={"iterations": iterations, "lr": 0.01, "warmup_iterations": 4},
        eval={"every": 30, "metric": "coco", "max_images": 4},
        log_every=2,
    )


def run_env(tmp: Path, name: str, base: dict, runs: Path | None = None, iterations: int = 120) -> dict:
    study = tmp / f"{name}.yaml"
    study.write_text(team_study(name, iterations))
    return {**base, "STUDY": str(study), "RUNS": str(runs or tmp / f"runs-{name}"), "NAME": name}


def start_run(command: str, env: dict, log: Path, flags=tuple(TEST_FLAGS)) -> subprocess.Popen:
    """The page's ``command`` with ``flags`` added, in a process group of its own (stderr kept)."""
    env = {**env, "TEAM_TEST_FLAGS": " ".join(flags)}
    cmd = shell(command, env) + " $TEAM_TEST_FLAGS"
    with open(log, "w") as out:
        return subprocess.Popen(
            ["bash", "-c", "exec " + cmd], env=env, stdout=out, stderr=subprocess.PIPE, text=True,
            start_new_session=True, cwd=log.parent,
        )  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float = 900) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def checkpoint(env: dict) -> Path | None:
    found = list(Path(env["RUNS"], env["NAME"], "trials").glob("*/checkpoint.pt"))
    return found[0] if found else None


def wait_checkpoint(env: dict, proc: subprocess.Popen, timeout: float = 600) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        ck = checkpoint(env)
        if ck is not None:
            return ck
        time.sleep(0.3)
    err = proc.stderr.read()[-3000:] if proc.poll() is not None and proc.stderr else ""
    raise AssertionError(f"no checkpoint of {env['NAME']} appeared (driver exit {proc.poll()}): {err}")


def history(uri: str, study: str) -> dict:
    """``{trial_id: {metric: [(step, value), ...]}}`` and the counts of runs by role, from the store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(study)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    roles = [r.data.tags.get("lsbench.role") for r in runs]
    out = {}
    for r in runs:
        if r.data.tags.get("lsbench.role") != "trial":
            continue
        assert r.info.status == "FINISHED" and r.data.tags["lsbench.status"] == "finished", r.data.tags
        out[r.data.tags["lsbench.trial_id"]] = {
            key: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, key))
            for key in r.data.metrics
            if not key.startswith(MACHINE_METRICS)
        }
    return {"trials": out, "studies": roles.count("study"), "trial_runs": roles.count("trial")}


def assert_same_history(got: dict, want: dict) -> None:
    """One study run, one run per trial, and every metric's steps and values as in the uninterrupted run."""
    assert (got["studies"], got["trial_runs"]) == (1, len(want["trials"])), (got["studies"], got["trial_runs"])
    assert got["trials"].keys() == want["trials"].keys()
    for tid, metrics in want["trials"].items():
        assert got["trials"][tid].keys() == metrics.keys(), tid
        for key, points in metrics.items():
            steps = [s for s, _ in got["trials"][tid][key]]
            assert steps == [s for s, _ in points], (tid, key, "steps lost or logged twice")
            assert [v for _, v in got["trials"][tid][key]] == pytest.approx([v for _, v in points], rel=1e-6), key


@pytest.fixture(scope="session")
def reference(mlflow_server, tmp_path_factory):
    """The uninterrupted run of the team study on the server: its history, and its tables and plots."""
    tmp = tmp_path_factory.mktemp("reference")
    env = run_env(tmp, "team-reference", mlflow_server.env)
    t0 = time.monotonic()
    rc, err = finish(start_run("run_server", env, tmp / "run.log"))
    assert rc == 0, err[-3000:]
    wall = time.monotonic() - t0
    print(f"\nteam study, uninterrupted, on the server: {wall:.1f} s")
    return {"env": env, "history": history(mlflow_server.uri, "team-reference"), "wall_s": wall}
