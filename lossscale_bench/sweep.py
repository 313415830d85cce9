"""Run a study's trials: Ray Tune schedules them, the driver is the only MLflow writer.

Why the funnel: trials run in Ray worker processes, and SQLite (MLflow's
default store) takes one writer at a time; several trials logging every step
hit "database is locked". So a trial never touches MLflow: its ``TuneSink``
hands batches of metrics/tags to ``tune.report`` and the driver's
``MlflowFunnel`` callback writes them, batched, into the trial's child run.
Any store works the same way (``--tracking-uri`` to an ``mlflow server``).

Resume is keyed by ``trial_id``, not by Ray's experiment state: finished and
diverged trials (by their MLflow status tag) are not scheduled again, and an
interrupted trial continues from its own checkpoint in its trial directory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .tracking import TERMINAL, MlflowSink, Tracker
from .tune_sink import TuneSink  # noqa: F401 - re-exported (benchmarks, tests)


class ClusterUnavailable(RuntimeError):
    """``--address`` names a Ray cluster this process cannot join; the message says why."""


class Infeasible(ClusterUnavailable):
    """No node of the cluster can ever hold some trial's resources (a user error: exit 2).

    Ray would accept the request and wait, silently, for a node that never
    comes; this is raised instead, naming the study file's field and what the
    cluster has. ``LSBENCH_SKIP_RESOURCE_CHECK=1`` (or ``lsbench run
    --no-resource-check``) skips the check for clusters whose autoscaler adds nodes on demand.
    """


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the driver while a study ran.

    A ``KeyboardInterrupt``, so that no ``except Exception`` in Tune, MLflow or
    our own retry loop swallows it, and Ray's C++ wait loops, which check for
    signals and turn a ``KeyboardInterrupt`` into their own (any other exception
    raised there comes out as a ``SystemError``), pass it on. ``run_study`` ends the
    study's open runs as KILLED (tag ``lsbench.status=interrupted``: not
    terminal, so a re-run resumes them) before re-raising; ``killed`` is how many.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)
        self.killed = 0

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


class _SignalsRaise:
    """While installed, SIGINT and SIGTERM raise :class:`Interrupted` in the main thread.

    Python's default SIGTERM ends the process at once (and ``ray.init`` replaces
    it with ``sys.exit``), leaving every MLflow run RUNNING forever; Tune's own
    SIGINT handler stops quietly and returns as if the study were done. So the
    driver takes both signals itself; :meth:`install` is called again after
    ``ray.init``. Outside the main thread (a library caller's worker thread)
    signals cannot be handled and nothing is installed.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.old: dict[int, Any] = {}
        self.active = threading.current_thread() is threading.main_thread()
        #: the first signal received (Ray may re-raise it as a plain KeyboardInterrupt or a SystemError)
        self.received: int | None = None

    def _raise(self, signum, frame):
        if self.received is None:
            self.received = int(signum)
        raise Interrupted(signum)

    def install(self) -> None:
        if self.active:
            for s in self.SIGNALS:
                prev = signal.signal(s, self._raise)
                self.old.setdefault(s, prev)

    def hold(self) -> None:
        """Ignore further signals while the open runs are being marked KILLED (a few writes)."""
        if self.active:
            for s in self.SIGNALS:
                signal.signal(s, signal.SIG_IGN)

    def restore(self) -> None:
        if self.active:
            for s, h in self.old.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)


@dataclass
class StudyResult:
    study: str
    tracking_uri: str
    outcomes: dict[str, dict] = field(default_factory=dict)   # trial_id -> outcome dict
    skipped: list[str] = field(default_factory=list)          # already done before this run

    def counts(self) -> dict[str, int]:
        c = {"finished": 0, "diverged": 0, "failed": 0}
        for o in self.outcomes.values():
            c[o.get("status", "failed")] = c.get(o.get("status", "failed"), 0) + 1
        c["already_done"] = len(self.skipped)
        return c


def _tune_trainable(config: dict) -> None:
    """The Tune function trainable: one lossscale_bench trial."""
    from .placement import is_distributed

    spec = config["trial"]
    if is_distributed(spec["cfg"]["resources"]):
        # devices_per_trial > 1: this function drives a Ray Train TorchTrainer and relays rank 0's reports.
        from .distributed import run_distributed_trial

        run_distributed_trial(spec)
        return
    from .trial import run_trial

    sink = TuneSink()
    outcome = run_trial(spec["cfg"], sink=sink, trial_dir=spec["trial_dir"], threads=spec["threads"])
    sink.flush(outcome=outcome.to_dict())


def _resources_of(config: dict):
    from ray.tune import PlacementGroupFactory

    from .placement import driver_bundle, is_distributed

    res = config["trial"]["cfg"]["resources"]
    if is_distributed(res):
        # Train V2 reserves the workers' devices in its own placement group; the Tune trial only drives it.
        return PlacementGroupFactory([driver_bundle(res)])
    return PlacementGroupFactory([config["trial"]["resources"]])


def _pct(fraction) -> str:
    """An mAP fraction as the report shows it: ``0.5120`` -> ``51.20%`` (``–`` when there is none)."""
    return "–" if fraction is None else f"{float(fraction) * 100:.2f}%"


class Progress:
    """One line per trial event, plus a running count and ETA (``quiet`` prints only the end)."""

    def __init__(self, total: int, already: int, concurrency: int, quiet: bool, stream=None) -> None:
        self.total, self.already, self.concurrency, self.quiet = total, already, max(1, concurrency), quiet
        self._stream = stream  # None: sys.stdout at print time (Tune pickles callbacks; keep streams out)
        self.started: dict[str, float] = {}
        self.durations: list[float] = []
        self.status: dict[str, str] = {}
        self.last_step: dict[str, int] = {}

    def line(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=self._stream or sys.stdout, flush=True)

    def _summary(self) -> str:
        vals = list(self.status.values())
        done = self.already + sum(v in ("finished", "diverged", "failed") for v in vals)
        running = sum(v == "running" for v in vals)
        eta = ""
        remaining = self.total - done
        if self.durations and remaining:
            mean = sum(self.durations) / len(self.durations)
            eta = f", ETA ~{mean * remaining / self.concurrency / 60:.1f} min"
        return (f"[{done}/{self.total} done, {running} running, {vals.count('failed')} failed, "
                f"{vals.count('diverged')} diverged{eta}]")

    def start(self, tid: str, label: str) -> None:
        self.started[tid] = time.time()
        self.status[tid] = "running"
        self.line(f"{self._summary()} start   {label} ({tid})")

    def step(self, tid: str, label: str, step: int, loss: float | None, iterations: int) -> None:
        """A per-trial progress line about every tenth of its iterations."""
        every = max(1, iterations // 10)
        last = self.last_step.get(tid, 0)
        if loss is not None and step // every > last // every:
            self.line(f"    {label} ({tid}) step {step}/{iterations} loss {loss:.4g}")
        self.last_step[tid] = step

    def end(self, tid: str, label: str, outcome: dict) -> None:
        self.status[tid] = outcome.get("status", "failed")
        if tid in self.started:
            self.durations.append(time.time() - self.started[tid])
        extra = ""
        if outcome.get("final_map") is not None:
            # percent with two decimals, as in the report (MLflow keeps the fractions)
            extra = f" mAP {_pct(outcome['final_map'])} mAP@0.5 {_pct(outcome.get('final_map_50'))}"
        if outcome.get("diverged_step") is not None:
            extra += f" diverged at step {outcome['diverged_step']}"
        if outcome.get("error"):
            extra += f" error: {outcome['error'][:200]}"
        self.line(f"{self._summary()} {self.status[tid]:8s} {label} ({tid}){extra}")


def _make_funnel(tracker: Tracker, run_ids: dict[str, str], labels: dict[str, str], study_result: StudyResult,
                 progress: Progress, iterations: dict[str, int], trial_plots=None):
    from ray.tune import Callback

    class MlflowFunnel(Callback):
        """Driver-side: the single writer to MLflow for every trial's reports."""

        def _tid(self, trial) -> str:
            return trial.config["trial"]["cfg"]["trial_id"]

        def on_trial_start(self, iteration, trials, trial, **info):
            tid = self._tid(trial)
            progress.start(tid, labels[tid])

        def on_trial_result(self, iteration, trials, trial, result, **info):
            raw = result.get("lsbench")
            if not raw:
                return
            tid = self._tid(trial)
            run_id = run_ids[tid]
            payload = json.loads(raw)
            if payload.get("metrics"):
                tracker.log_metrics(run_id, payload["metrics"])
                losses = [(s, v) for k, v, s in payload["metrics"] if k == "loss"]
                if losses:
                    progress.step(tid, labels[tid], losses[-1][0], losses[-1][1], iterations[tid])
            if payload.get("tags"):
                tracker.set_tags(run_id, payload["tags"])
            for path, apath in payload.get("artifacts", []):
                tracker.log_artifact(run_id, path, apath)
            if "outcome" in payload:
                outcome = payload["outcome"]
                study_result.outcomes[tid] = outcome
                tdir = trial.config["trial"].get("trial_dir")
                if tdir:
                    log_trial_plots(tracker, run_id, Path(tdir) / "plots", trial_plots)
                tracker.end_trial(run_id, outcome["status"])
                progress.end(tid, labels[tid], outcome)

        def on_trial_error(self, iteration, trials, trial, **info):
            # Retries (FailureConfig.max_failures) are exhausted: the process kept dying.
            tid = self._tid(trial)
            err = str(getattr(trial, "error_file", "") or "")
            msg = "trial process failed repeatedly"
            try:
                if err and Path(err).exists():
                    msg = Path(err).read_text()[-2000:]
            except OSError:
                pass
            if "No space left on device" in msg or "[Errno 28]" in msg:
                msg = "disk full: " + msg  # the process died writing; say so before its traceback
            outcome = {"trial_id": tid, "status": "failed", "error": msg}
            study_result.outcomes[tid] = outcome
            tracker.set_tags(run_ids[tid], {"lsbench.status": "failed", "lsbench.error": msg[-5000:]})
            tracker.end_trial(run_ids[tid], "failed")
            progress.end(tid, labels[tid], outcome)

        def on_trial_recover(self, iteration, trials, trial, **info):
            tid = self._tid(trial)
            progress.line(f"    retrying {labels[tid]} ({tid}) from its last checkpoint")
            tracker.set_tags(run_ids[tid], {"lsbench.retries": getattr(trial, "num_failures", "?")})

    return MlflowFunnel()


def log_trial_plots(tracker: Tracker, run_id: str, out_dir: Path, draw=None) -> None:
    """Loss, loss-scale and per-layer heatmaps as artifacts of the trial's run, drawn from the
    store (so a resumed trial's plots cover all of it). A plotting error never fails a trial.

    The drawing function is handed in (``run_study(trial_plots=...)``; the CLI passes
    ``lossscale_bench.plots.run_plots``): plots belong to the reporting layer, above this one.
    """
    if draw is None:
        return
    try:
        draw(tracker.client, run_id, out_dir)
    except Exception as exc:  # noqa: BLE001
        tracker.set_tags(run_id, {"lsbench.plot_error": f"{type(exc).__name__}: {exc}"[:500]})


def study_dir(runs_dir: str | Path, study_name: str) -> Path:
    return Path(runs_dir).expanduser().resolve() / study_name


def run_study(study, *, runs_dir: str | Path = "runs", tracking_uri: str | None = None,
              max_concurrent: int | None = None, address: str | None = None, num_cpus: int | None = None,
              executor: str = "ray", quiet: bool = False, stream=None, trial_plots=None,
              check_resources: bool = True) -> StudyResult:
    """Run every trial of ``study`` that has not finished or diverged yet.

    ``trial_plots(client, run_id, out_dir)``, if given, draws each finished trial's plots from
    the store and is logged as the run's artifacts (the CLI passes ``plots.run_plots``).

    With the Ray executor the cluster is joined, and every trial checked to fit
    some node (:func:`check_feasible`; ``check_resources=False`` or
    ``LSBENCH_SKIP_RESOURCE_CHECK=1`` skips it), before any MLflow run is opened.
    SIGINT/SIGTERM (main thread only) end the open runs as KILLED and raise
    :class:`Interrupted`; the same call again resumes.
    """
    if executor not in ("ray", "local"):
        raise ValueError(f"unknown executor {executor!r}; allowed: ray, local")
    from .data.prepare import prepare_dataset
    from .study.configs import change_note
    from .tracking import open_store, resolve_tracking_uri

    runs_dir = Path(runs_dir).expanduser().resolve()
    uri = resolve_tracking_uri(tracking_uri, runs_dir)
    open_store(uri, create=True)  # a bad store (corrupt, read-only, foo://) fails now, before data or Ray
    sdir = study_dir(runs_dir, study.name)
    trials = study.trials()
    result = StudyResult(study=study.name, tracking_uri=uri)
    guard = _SignalsRaise()
    guard.install()
    tracker, parent, run_ids, ray_started = None, None, {}, False
    try:
        # Data first: a study whose data is missing fails before any trial starts.
        prepare_dataset(trials[0].dataset)

        tracker = Tracker(uri, artifact_root=runs_dir / "artifacts")
        existing = tracker.trial_runs(tracker.experiment_id(study.name))
        todo = []
        for cfg in trials:
            run = existing.get(cfg.trial_id)
            if run is not None and run.data.tags.get("lsbench.status") in TERMINAL:
                result.skipped.append(cfg.trial_id)
            else:
                todo.append(cfg)
        if todo and executor == "ray":
            # The cluster before any run is opened: one that cannot run the study leaves no RUNNING run.
            ray_started = connect_ray(address, num_cpus, quiet)
            guard.install()  # ray.init put its own SIGTERM handler (sys.exit) in place
            skip = os.environ.get("LSBENCH_SKIP_RESOURCE_CHECK", "").lower() in ("1", "true", "yes")
            if check_resources and not skip:
                check_feasible(study, todo, cluster_nodes())
        exp_id, parent = tracker.study_run(study.name, study.description, getattr(study, "source", None))
        # finished trials are not run again, so a baseline moved in the study file is re-tagged here
        tracker.sync_baseline_tags(trials, existing)
        for cfg in todo:
            run_ids[cfg.trial_id] = tracker.ensure_trial_run(exp_id, parent, cfg, existing.get(cfg.trial_id))
        labels = {cfg.trial_id: cfg.label for cfg in trials}
        concurrency = max_concurrent or max(1, int((num_cpus or os.cpu_count() or 1)
                                                   // max(1.0, float(trials[0].resources.get("cpus_per_trial", 1)))))
        progress = Progress(len(trials), len(result.skipped), concurrency, quiet, stream)
        if result.skipped:
            progress.line(f"{len(result.skipped)} of {len(trials)} trials already finished or diverged: not run again")
        changed = change_note(study.name, trials, {t: (r.data.tags, r.data.params) for t, r in existing.items()})
        if changed:  # the study file changed under the same name: its old trials stay apart (the report too)
            progress.line(changed)
        if todo:
            if executor == "local":
                _run_local(todo, tracker, run_ids, sdir, result, progress, trial_plots)
            else:
                _run_ray(study, todo, tracker, run_ids, labels, sdir, result, progress, max_concurrent, quiet,
                         trial_plots)
        # counted from the store: trials finished by earlier invocations count too
        tracker.end_study(parent, [cfg.trial_id for cfg in trials])
        return result
    except BaseException as exc:
        if guard.received is None and not isinstance(exc, KeyboardInterrupt):
            raise
        # whatever came out of the code the signal interrupted (Ray re-raises it in its own ways)
        stop = exc if isinstance(exc, Interrupted) else Interrupted(guard.received or signal.SIGINT)
        guard.hold()
        if tracker is not None and parent is not None:
            stop.killed = _end_interrupted(tracker, parent, {cfg.trial_id for cfg in todo})
        guard.install()  # a second signal may cut the Ray shutdown short
        if stop is exc:
            raise
        raise stop from None
    finally:
        try:
            if ray_started:
                import ray

                ray.shutdown()
        finally:
            guard.restore()


def _end_interrupted(tracker: Tracker, parent: str, trial_ids: set[str]) -> int:
    """End this invocation's still-RUNNING trial runs, and the parent, as KILLED; return how many trials.

    Tagged ``lsbench.status=interrupted`` (not TERMINAL), so the next run of the
    study re-runs them from their checkpoints. A run whose outcome already arrived
    (status tag finished/diverged) but was not closed yet is closed as that outcome.
    """
    killed = 0
    for tid, run in tracker.trial_runs(tracker.client.get_run(parent).info.experiment_id).items():
        rid = run.info.run_id
        if tid not in trial_ids or run.info.status != "RUNNING":
            continue
        status = run.data.tags.get("lsbench.status")
        if status in TERMINAL:
            tracker.end_trial(rid, status)
        else:
            tracker.end_interrupted(rid)
            killed += 1
    tracker.end_interrupted(parent)
    return killed


def _threads(cfg) -> int:
    return max(1, int(float(cfg.resources.get("cpus_per_trial", 1))))


def _run_local(todo, tracker, run_ids, sdir, result, progress, trial_plots=None) -> None:
    """Trials one after another in this process (debugging; no Ray)."""
    from .trial import run_trial

    for cfg in todo:
        progress.start(cfg.trial_id, cfg.label)
        sink = MlflowSink(tracker, run_ids[cfg.trial_id])
        outcome = run_trial(cfg, sink=sink, trial_dir=sdir / "trials" / cfg.trial_id, threads=_threads(cfg)).to_dict()
        result.outcomes[cfg.trial_id] = outcome
        log_trial_plots(tracker, run_ids[cfg.trial_id], sdir / "trials" / cfg.trial_id / "plots", trial_plots)
        tracker.end_trial(run_ids[cfg.trial_id], outcome["status"])
        progress.end(cfg.trial_id, cfg.label, outcome)


#: seconds to wait for a TCP answer from ``--address`` before ray.init (which would retry for minutes)
PROBE_TIMEOUT_S = float(os.environ.get("LSBENCH_ADDRESS_TIMEOUT_S", "5"))


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port``, ``ray://host:port``, ``[::1]:6379`` -> (host, port); None when there is no port."""
    rest = address.split("://", 1)[1] if "://" in address else address
    rest = rest.split("/", 1)[0]
    if rest.startswith("["):  # IPv6
        host, _, tail = rest[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host, int(port)


#: the largest TCP port; a larger one would make the probe's connect() fail with an unrelated error
_MAX_PORT = 65535


#: the HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, a Ray Client
#: server) answers with its own SETTINGS frame (frame type 4, the 4th byte of the 9-byte header)
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _speaks_grpc(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        sock.sendall(_H2_HELLO)
        head = b""
        while len(head) < 9:
            chunk = sock.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except OSError:
        return False
    return len(head) == 9 and head[3] == 4


def probe_address(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`ClusterUnavailable` unless a Ray cluster can answer on ``address``'s port.

    ``ray.init`` keeps retrying an address for many minutes without a word when
    nobody answers there, or when something other than Ray does (every attempt
    waits ~40 s, 20 attempts). So first one TCP connect with a timeout (a host
    that does not resolve, a closed port, a firewall), then an HTTP/2 hello that
    any gRPC server, Ray's GCS included, answers at once (skipped with TLS,
    ``RAY_USE_TLS``). ``auto`` and addresses without a port are left to Ray, which fails fast on them.
    """
    hp = _host_port(address)
    if hp is None:
        return
    host, port = hp
    if port > _MAX_PORT:
        raise ClusterUnavailable(f"cannot join the Ray cluster at {address}: port {port} is not a TCP port "
                                 f"(0 to {_MAX_PORT})")
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true") or _speaks_grpc(sock, timeout):
                return
        why = (f"something answers on {host} port {port}, but not a Ray cluster (no gRPC reply within "
               f"{timeout:g} s; the head's `ray status` prints the address to use)")
    except socket.gaierror:
        why = f"the host name {host!r} does not resolve"
    except socket.timeout:
        why = f"no answer from {host} port {port} within {timeout:g} s (a firewall, or the wrong host)"
    except ConnectionRefusedError:
        why = f"nothing listens on {host} port {port} (is the cluster up? `ray start --head` prints its address)"
    except OSError as exc:
        why = f"{host} port {port} cannot be reached ({exc.strerror or exc})"
    raise ClusterUnavailable(f"cannot join the Ray cluster at {address}: {why}")


def _first_words(text: str, cause: BaseException) -> str:
    """The first line of Ray's error, cut before any traceback it quotes ("Last connection error:
    Traceback (most recent call last): ..." from a GCS that never answered): one line, no traceback."""
    first = text.strip().splitlines()[0] if text.strip() else type(cause).__name__
    for marker in ("Last connection error", "Traceback"):
        if marker in first:
            first = first[:first.index(marker)]
    return first.strip().rstrip(".:;, ")[:300] or type(cause).__name__


def connect_ray(address: str | None, num_cpus: int | None, quiet: bool) -> bool:
    """Join ``address`` (else ``$RAY_ADDRESS``) or start a local Ray; True if this call started it.

    An address is probed first (:func:`probe_address`); a join that fails says why in one line.
    """
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": not quiet,
                              "configure_logging": True, "logging_level": "WARNING"}
    if address:
        probe_address(address)
        try:
            ray.init(address=address, **kwargs)
        except ValueError as exc:
            # Ray's own check of the address text ("Invalid address format: foo"), or a ray:// address
            # without the ray[client] extra: a user error, said before any connection is tried
            raise ClusterUnavailable(f"cannot join the Ray cluster at {address}: {str(exc).strip()[:300]} "
                                     "(--address takes host:port, ray://host:port or auto; "
                                     "see docs/cluster.md)") from None
        except (ConnectionError, RuntimeError) as exc:
            cause = exc
            while cause.__cause__ is not None:
                cause = cause.__cause__
            text = str(cause)
            if "auth" in text.lower() and "token" in text.lower():
                raise ClusterUnavailable(
                    f"cannot join the Ray cluster at {address}: the cluster's authentication token is missing "
                    "or wrong (a cluster started with token authentication, Ray's default, needs "
                    "RAY_AUTH_MODE=token and its token in ~/.ray/auth_token or RAY_AUTH_TOKEN on this "
                    "machine; see docs/cluster.md)") from None
            raise ClusterUnavailable(f"cannot join the Ray cluster at {address}: {_first_words(text, cause)} "
                                     "(is a Ray head running there and reachable from here? "
                                     "see docs/cluster.md)") from None
    else:
        # address="local": always a fresh instance of our own, never a cluster some other
        # process left running on this machine (that is what --address is for). Ray 2.60 warns on
        # every such start that token authentication is on; for an instance that lives only as long
        # as this process, on this machine, that is noise between the user and a one-line error.
        import logging

        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kwargs)
    return True


def _resource_field(study, row: int, key: str) -> str:
    """Where the study file sets ``key`` for scaling entry ``row``: its own override or the study's."""
    entry = study.scaling[row] if 0 <= row < len(study.scaling) else None
    own = entry.resources.given() if entry is not None and entry.resources is not None else {}
    return f"scaling[{row}].resources.{key}" if key in own else f"resources.{key}"


def check_feasible(study, trials, nodes: list[dict[str, float]]) -> None:
    """Raise :class:`Infeasible` if some trial's resources fit no node of ``nodes`` (or no node has
    its backend's device); every distinct field at fault is named, in one line."""
    from .placement import unplaceable

    problems: dict[str, str] = {}
    for cfg in trials:
        found = unplaceable(cfg.resources, nodes)
        if found:
            key, why = found
            problems.setdefault(_resource_field(study, cfg.row, key), why)
    if problems:
        src = getattr(study, "source", "") or "study"
        raise Infeasible(f"{src}: " + "; ".join(f"{f}: {why}" for f, why in problems.items())
                         + " (if an autoscaler adds such nodes on demand: --no-resource-check or "
                           "LSBENCH_SKIP_RESOURCE_CHECK=1)")


def cluster_nodes() -> list[dict[str, float]]:
    """Resource totals of each alive node of the connected Ray cluster."""
    import ray

    return [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]


def _run_ray(study, todo, tracker, run_ids, labels, sdir, result, progress, max_concurrent, quiet,
             trial_plots=None) -> None:
    """The trials as one Tune run on the cluster :func:`connect_ray` joined."""
    import ray
    from ray import tune

    from .backends import ray_resources

    if max_concurrent is None:
        # multi-device trials hold their devices through Ray Train, not the Tune bundle:
        # do not start more trials than the cluster's devices can serve
        from .placement import tune_concurrency

        max_concurrent = tune_concurrency([c.resources for c in todo], ray.cluster_resources())
    specs = []
    for cfg in todo:
        res = ray_resources(cfg.resources.get("backend", "cpu"), int(cfg.resources.get("devices_per_trial", 1)),
                            float(cfg.resources.get("cpus_per_trial", 1)))
        specs.append({"cfg": cfg.to_dict(), "trial_dir": str(sdir / "trials" / cfg.trial_id),
                      "threads": _threads(cfg), "resources": res})
    funnel = _make_funnel(tracker, run_ids, labels, result, progress,
                          {c.trial_id: int(c.schedule["iterations"]) for c in todo}, trial_plots)
    # Tune's own result files are off (TUNE_DISABLE_AUTO_CALLBACK_LOGGERS): MLflow holds the results,
    # so its end-of-run complaint that they are missing is noise.
    import logging

    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    tuner = tune.Tuner(
        tune.with_resources(_tune_trainable, _resources_of),
        param_space={"trial": tune.grid_search(specs)},
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent, reuse_actors=False,
                                    trial_dirname_creator=lambda t: t.config["trial"]["cfg"]["trial_id"]),
        run_config=tune.RunConfig(name=f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                                  storage_path=str(sdir / "ray"), callbacks=[funnel], verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=study.max_failures)),
    )
    # Ctrl-C is ours (run_study's _SignalsRaise), not Tune's: its handler ends the run quietly as if done
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    tuner.fit()
    for cfg in todo:  # a trial Ray never reported on (cancelled) stays visible as failed
        if cfg.trial_id not in result.outcomes:
            outcome = {"trial_id": cfg.trial_id, "status": "failed", "error": "no result from Ray"}
            result.outcomes[cfg.trial_id] = outcome
            tracker.set_tags(run_ids[cfg.trial_id], {"lsbench.status": "failed", "lsbench.error": outcome["error"]})
            tracker.end_trial(run_ids[cfg.trial_id], "failed")
