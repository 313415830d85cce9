"""Run a study's trials: in this process or through Ray Tune, the driver the only MLflow writer.

Resume is keyed by ``trial_id``, not by Ray's experiment state: finished and
diverged trials (by their MLflow status tag) are not scheduled again, and an
interrupted trial continues from its own checkpoint in its trial directory.

Why :func:`run_study` is a row of named steps on one :class:`_StudyRun`: the
order is the contract (a bad store, missing data or an unusable cluster fail
before any MLflow run is opened; the runs are opened before any trial starts),
and a signal may arrive during any step, so what an interruption must close
(the tracker, the parent run, this invocation's trials) lives on one object.
Tune itself is in ``tune_runner``, the MLflow funnel in ``funnel``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..tracking.mlflow_sink import MlflowSink
from ..tracking.tracker import TERMINAL, Tracker
from .cluster import check_feasible, cluster_nodes, connect_ray, resource_check_skipped
from .outcomes import StudyResult, begin_trial, record_end, record_failure
from .placement import threads_of
from .progress import Progress
from .signals import SignalsRaise


def study_dir(runs_dir: str | Path, study_name: str) -> Path:
    """``<runs_dir>/<study>``, absolute: Ray trials run in their own working directories."""
    return Path(runs_dir).expanduser().resolve() / study_name


@dataclass
class _Options:
    """How :func:`run_study` was asked to run (its keyword arguments, less the store's)."""

    max_concurrent: int | None
    address: str | None
    num_cpus: int | None
    executor: str
    quiet: bool
    stream: Any
    trial_plots: Any
    check_resources: bool
    #: the trials to run instead of all the study's (a round of a seed plan); None: study.trials()
    trials: Any = None
    #: where a new study's artifacts go (``--artifacts-uri``); None: the store's default (tracking.artifacts)
    artifacts_uri: str | None = None
    #: end the parent run when the trials are done (False: a round of a seed plan, ``rounds.finish_plan`` ends it)
    end_parent: bool = True


def run_study(
    study,
    *,
    runs_dir: str | Path = "runs",
    tracking_uri: str | None = None,
    max_concurrent: int | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    executor: str = "ray",
    quiet: bool = False,
    stream=None,
    trial_plots=None,
    check_resources: bool = True,
    wait: bool = False,
    trials=None,
    artifacts_uri: str | None = None,
    end_parent: bool = True,
) -> StudyResult:
    """Run every trial of ``study`` that has not finished or diverged yet.

    ``trial_plots(client, run_id, out_dir)``, if given, draws each finished trial's plots from
    the store and is logged as the run's artifacts (the CLI passes ``plots.run_plots``).

    With the Ray executor the cluster is joined, and every trial checked to fit
    some node (:func:`.cluster.check_feasible`; ``check_resources=False`` or
    ``LSBENCH_SKIP_RESOURCE_CHECK=1`` skips it), before any MLflow run is opened.
    SIGINT/SIGTERM (main thread only) end the open runs as KILLED and raise
    :class:`.signals.Interrupted`; the same call again resumes.

    ``trials``: run these of the study's trials (and count only these) instead of all of them:
    a round of a study whose seeds are added until decided; with ``end_parent=False`` the study's
    parent run is left RUNNING for the next round (:mod:`.rounds`).

    ``artifacts_uri``: the root of a new study's artifact location (``<uri>/<study>``); without it an
    MLflow server keeps them in its own artifact store, a SQLite store beside ``mlflow.db``, a database
    server under ``<runs_dir>/artifacts`` (:func:`..tracking.artifacts.artifact_location`).

    The whole call holds the runs folder's lock (:mod:`.runs_lock`): a second runner on the
    same folder or SQLite store raises :class:`.runs_lock.RunsFolderBusy`, or with ``wait=True``
    waits for the first to end. The store is created and migrated under the lock.
    """
    if executor not in ("ray", "local"):
        raise ValueError(f"unknown executor {executor!r}; allowed: ray, local")
    if study.resources.repeatable:  # first: the local executor trains here, and data prep imports torch
        from ..core.portable import pin

        pin()
    from ..tracking.store import check_scheme, resolve_tracking_uri, sqlite_path
    from .runs_lock import runs_lock

    runs_dir = Path(runs_dir).expanduser().resolve()
    uri = resolve_tracking_uri(tracking_uri, runs_dir)
    check_scheme(uri)  # foo:// is refused before the runs folder (and its lock file) is created
    opts = _Options(
        max_concurrent,
        address,
        num_cpus,
        executor,
        quiet,
        stream,
        trial_plots,
        check_resources,
        None if trials is None else list(trials),
        artifacts_uri,
        end_parent,
    )
    with runs_lock(runs_dir, sqlite_path(uri), study.name, wait=wait, stream=stream):
        return _run_locked(study, runs_dir, uri, opts)


def _run_locked(study, runs_dir: Path, uri: str, opts: _Options) -> StudyResult:
    """:func:`run_study` once its lock is held: the store checked, the steps run, signals handled."""
    from ..tracking.store import open_store

    open_store(uri, create=True)  # a bad store (corrupt, read-only, foo://) fails now, before data or Ray
    run = _StudyRun(study, runs_dir, uri, opts)
    outer = SignalsRaise.current  # a seed plan's rounds: one guard over them all (study_signals)
    guard = outer or SignalsRaise()
    guard.install()
    try:
        guard.check()  # a signal that came before (between two rounds) stops the study before it starts
        result = run.execute(guard)
        guard.opened_parent = True
        guard.check()
        return result
    except BaseException as exc:
        guard.opened_parent = guard.opened_parent or run.parent is not None
        stop = guard.interruption(exc)
        if stop is None:
            run.end_crashed(exc)
            raise
        guard.hold()
        stop.killed = guard.killed = run.end_interrupted()
        guard.install()  # a second signal may cut the Ray shutdown short
        if stop is exc:
            raise
        raise stop from None
    finally:
        if run.head_watch is not None:
            run.head_watch.stop()
        try:
            if run.ray_started:
                import ray

                ray.shutdown()
        finally:
            if outer is None:
                guard.restore()
            else:
                guard.install()  # the rounds' guard again (ray.init replaced a handler)


class _StudyRun:
    """One invocation of a study: the steps of :func:`run_study`, and the state they hand on."""

    def __init__(self, study, runs_dir: Path, uri: str, opts: _Options) -> None:
        self.study, self.uri, self.opts = study, uri, opts
        self.artifact_root = runs_dir / "artifacts"
        self.sdir = study_dir(runs_dir, study.name)
        self.trials = study.trials() if opts.trials is None else opts.trials
        self.result = StudyResult(study=study.name, tracking_uri=uri)
        self.tracker: Tracker | None = None
        self.parent: str | None = None
        self.run_ids: dict[str, str] = {}
        #: trial id -> (config, stored run) of the pending trials that have a run already: taken up
        #: again only when the trial starts (:func:`.outcomes.begin_trial`)
        self.continued: dict[str, tuple] = {}
        self.todo: list = []
        self.relabelled: list[tuple[str, str]] = []
        self.ray_started = False
        #: the joined cluster's head, watched (:mod:`.head_watch`); None for a Ray of our own
        self.head_watch = None

    def execute(self, guard: SignalsRaise) -> StudyResult:
        """Data, store, cluster, runs, trials, in that order: each may stop the study before the next."""
        from ..data.prepare import prepare_dataset

        # Data first: a study whose data is missing fails before any trial starts.
        prepare_dataset(self.trials[0].dataset)
        self.tracker = Tracker(self.uri, artifact_root=self.artifact_root, artifacts_uri=self.opts.artifacts_uri)
        existing = self._reconcile(self.tracker.trial_runs(self.tracker.experiment_id(self.study.name)))
        self.todo = self._pending(existing)
        if self.todo and self.opts.executor == "ray":
            self._join_cluster(guard)
        self._open_runs(existing)
        progress = self._progress(existing)
        if self.todo:
            self._run_trials(progress)
        if self.opts.end_parent:  # counted from the store: trials finished by earlier invocations count too
            self.tracker.end_study(self.parent, [cfg.trial_id for cfg in self.trials])
        else:  # a round of a seed plan: more may follow (rounds.finish_plan ends it)
            self.tracker.set_tags(self.parent, {"lsbench.status": "running"})
        return self.result

    def _reconcile(self, existing: dict[str, Any]) -> dict[str, Any]:
        """Runs an earlier driver left RUNNING (killed with SIGKILL, a machine that went down) closed as
        what they are; the trial runs of the store's study, read again when one changed.

        No driver runs them: this one holds the runs folder's lock (:mod:`.runs_lock`), and the kernel
        frees a dead holder's. A run whose ``lsbench.status`` says how its trial ended (finished,
        diverged, failed: the outcome arrived, the MLflow status did not follow) gets that status; any
        other ends KILLED, tagged interrupted, as after a signal: its trial is resumed.
        """
        mended = 0
        for run in existing.values():
            if run.info.status != "RUNNING":
                continue
            status = run.data.tags.get("lsbench.status")
            if status in (*TERMINAL, "failed"):
                self.tracker.end_trial(run.info.run_id, status)
            else:
                self.tracker.end_interrupted(run.info.run_id)
            mended += 1
        if not mended:
            return existing
        return self.tracker.trial_runs(self.tracker.experiment_id(self.study.name))

    def _pending(self, existing: dict[str, Any]) -> list:
        """The trials to run; finished and diverged ones (by their run's status tag) are only counted."""
        todo = []
        for cfg in self.trials:
            run = existing.get(cfg.trial_id)
            if run is not None and run.data.tags.get("lsbench.status") in TERMINAL:
                self.result.skipped.append(cfg.trial_id)
            else:
                todo.append(cfg)
        return todo

    def _join_cluster(self, guard: SignalsRaise) -> None:
        """The cluster before any run is opened: one that cannot run the study leaves no RUNNING run."""
        from ..core.portable import PORTABLE_ENV

        # a repeatable study's pins reach every worker, a joined cluster's too (core/portable.py)
        self.ray_started = connect_ray(
            self.opts.address,
            self.opts.num_cpus,
            self.opts.quiet,
            env_vars=PORTABLE_ENV if self.study.resources.repeatable else None,
        )
        guard.install()  # ray.init put its own SIGTERM handler (sys.exit) in place
        local = not (self.opts.address or os.environ.get("RAY_ADDRESS"))  # a Ray of our own: --num-cpus helps
        if not local:  # a joined cluster's head may die: one line and exit 4, not Ray's exit 1 a minute later
            from .head_watch import HeadWatch, gcs_address

            gcs = gcs_address()
            self.head_watch = HeadWatch(gcs, self.end_interrupted).start() if gcs else None
        if self.opts.check_resources and not resource_check_skipped():
            check_feasible(self.study, self.todo, cluster_nodes(), local=local)

    def _open_runs(self, existing: dict[str, Any]) -> None:
        """The study's parent run and a child run per pending trial (existing ones are continued)."""
        study = self.study
        exp_id, self.parent = self.tracker.study_run(study.name, study.description, getattr(study, "source", None))
        # finished trials are not run again, so a baseline moved in the study file is re-tagged here
        self.tracker.sync_baseline_tags(self.trials, existing)
        self.relabelled = self.tracker.sync_labels(self.trials, existing)
        for cfg in self.todo:
            run = existing.get(cfg.trial_id)
            if run is None:
                self.run_ids[cfg.trial_id] = self.tracker.ensure_trial_run(exp_id, self.parent, cfg)
            else:  # its earlier result (failed, interrupted) stays as it is until the trial starts again
                self.run_ids[cfg.trial_id] = run.info.run_id
                self.continued[cfg.trial_id] = (cfg, run)

    def _progress(self, existing: dict[str, Any]) -> Progress:
        """The console's progress, after saying what is not run again and whether the study file changed."""
        from ..study.configs import change_note

        trials, skipped, opts = self.trials, self.result.skipped, self.opts
        cpus_per_trial = max(1.0, float(trials[0].resources.get("cpus_per_trial", 1)))
        # the ETA divides by it: the local executor runs one trial at a time, whatever the CPUs
        concurrency = (
            1
            if opts.executor == "local"
            else (opts.max_concurrent or max(1, int((opts.num_cpus or os.cpu_count() or 1) // cpus_per_trial)))
        )
        progress = Progress(len(trials), len(skipped), concurrency, opts.quiet, opts.stream)
        if skipped:
            progress.line(f"{len(skipped)} of {len(trials)} trials already finished or diverged: not run again")
        changed = change_note(self.study.name, trials, {t: (r.data.tags, r.data.params) for t, r in existing.items()})
        if changed:  # the study file changed under the same name: its old trials stay apart (the report too)
            progress.notice(changed)
        if self.relabelled:  # a label is not part of the trial id: the results stay, the rows are renamed
            pairs = ", ".join(f"{old!r} -> {new!r}" for old, new in self.relabelled)
            progress.notice(f"label(s) changed in the study file, stored runs renamed: {pairs}")
        return progress

    def _run_trials(self, progress: Progress) -> None:
        """The pending trials on the chosen executor; Tune (and so Ray) is imported only for ``ray``."""
        if self.opts.executor == "local":
            _run_local(
                self.todo,
                self.tracker,
                self.run_ids,
                self.continued,
                self.sdir,
                self.result,
                progress,
                self.opts.trial_plots,
            )
            return
        from .tune_runner import run_tune

        labels = {cfg.trial_id: cfg.label for cfg in self.trials}
        run_tune(
            self.study,
            self.todo,
            self.tracker,
            self.run_ids,
            self.continued,
            labels,
            self.sdir,
            self.result,
            progress,
            self.opts.max_concurrent,
            self.opts.trial_plots,
        )

    def end_interrupted(self) -> int:
        """After a signal: close this invocation's open runs (if any were opened); how many were KILLED."""
        if self.tracker is None or self.parent is None:
            return 0
        killed = _close_open_runs(self.tracker, self.parent, {cfg.trial_id for cfg in self.todo}, self.result)
        self.tracker.end_interrupted(self.parent)
        return killed

    def end_crashed(self, exc: BaseException) -> None:
        """After an error that stopped the study (a store fault, a bug): no run is left RUNNING.

        A trial that had started ends failed with the error; one that had not ends KILLED
        (resumable, as after a signal); the parent ends FAILED. An earlier invocation's
        result is not touched (:attr:`continued`). A second error while closing (the store
        is what failed) leaves the first to be reported.
        """
        if self.tracker is None or self.parent is None:
            return
        from ..trial.outcome import failure_text

        error = f"the study stopped: {failure_text(exc)}"
        try:
            _close_open_runs(self.tracker, self.parent, {cfg.trial_id for cfg in self.todo}, self.result, error)
            self.tracker.set_tags(self.parent, {"lsbench.status": "failed", "lsbench.error": error[:5000]})
            self.tracker.client.set_terminated(self.parent, status="FAILED")
        except Exception:  # noqa: BLE001 - the error that stopped the study is the one to report
            pass


def _close_open_runs(
    tracker: Tracker, parent: str, trial_ids: set[str], result: StudyResult, error: str | None = None
) -> int:
    """End this invocation's still-RUNNING trial runs; return how many were marked KILLED.

    A run whose outcome already arrived (status tag finished/diverged) but was not closed
    yet is closed as that outcome. With ``error`` (the study stopped on an error) a trial
    that had started ends failed with it. Every other run ends KILLED, tagged
    ``lsbench.status=interrupted`` (not TERMINAL): the next run of the study re-runs it
    from its checkpoint.
    """
    killed = 0
    for tid, run in tracker.trial_runs(tracker.client.get_run(parent).info.experiment_id).items():
        rid = run.info.run_id
        if tid not in trial_ids or run.info.status != "RUNNING":
            continue
        status = run.data.tags.get("lsbench.status")
        if status in TERMINAL:
            tracker.end_trial(rid, status)
        elif error is not None and status == "running":
            record_failure(tracker, result, tid, rid, error)
        else:
            tracker.end_interrupted(rid)
            killed += 1
    return killed


def _run_local(
    todo,
    tracker: Tracker,
    run_ids: dict[str, str],
    continued: dict[str, tuple],
    sdir: Path,
    result: StudyResult,
    progress: Progress,
    trial_plots=None,
) -> None:
    """Trials one after another in this process (debugging; no Ray)."""
    from ..core.uninterrupted import safe_point
    from ..trial import run_trial

    for cfg in todo:
        safe_point()  # a stop signal between two trials: before the next one starts
        begin_trial(tracker, continued, cfg.trial_id)
        progress.start(cfg.trial_id, cfg.label)
        sink = MlflowSink(tracker, run_ids[cfg.trial_id])
        tdir = sdir / "trials" / cfg.trial_id
        outcome = run_trial(
            cfg, sink=sink, trial_dir=tdir, threads=threads_of(cfg.resources), stop_check=safe_point
        ).to_dict()
        record_end(
            tracker,
            result,
            progress,
            cfg.trial_id,
            cfg.label,
            run_ids[cfg.trial_id],
            outcome,
            tdir / "plots",
            trial_plots,
        )
