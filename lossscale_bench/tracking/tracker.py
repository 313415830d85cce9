"""MLflow conventions of DESIGN.md: the one writer of a study's runs (``Tracker``).

One experiment per study, one parent run per study (tag
``lsbench.role=study``), one child run per trial (``lsbench.role=trial``,
``lsbench.trial_id``, ``lsbench.status``, ...). A re-run finds the existing
runs by tag, so nothing is duplicated. Writes are batched (``log_batch``) and
retried when SQLite reports "database is locked".
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..study.precisions import is_emulated
from .artifacts import artifact_location
from .client import retry, store_client
from .run_status import base_run_name
from .store import open_store, sqlite_path
from .store_open import open_client

TERMINAL = ("finished", "diverged")


def _bool_tag(value) -> str:
    """Tags are strings; booleans are written ``true``/``false`` as in the study file."""
    return "true" if value else "false"


class Tracker:
    """Study- and trial-level bookkeeping on one MLflow store."""

    def __init__(
        self, tracking_uri: str, artifact_root: str | Path | None = None, artifacts_uri: str | None = None
    ) -> None:
        """``artifact_root``: the folder a database store's new experiments keep their artifacts in
        (``<root>/<study>``); ``artifacts_uri``: a URI that replaces it for every store
        (:func:`.artifacts.artifact_location` says where artifacts go)."""
        import logging

        # Alembic/MLflow print migration chatter on first use of a store.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        # MLflow's client writes "View run ... at: <url>" to stdout whenever a run on a server ends: one pair
        # of lines for every trial under the study's own progress lines (and under --quiet)
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        # it logs a traceback for every database error; ours become one StoreError line (store_faults.store_error)
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        # checked before MLflow opens it: a bad store is one StoreError line, never a traceback
        # or a new empty store; the Tracker writes, so the store may be created
        self.uri = open_store(tracking_uri, create=True)
        from .store import ensure_artifact_scheme

        ensure_artifact_scheme()
        self.client = open_client(tracking_uri)  # a new database's tables made under its server's lock
        self.artifact_root = Path(artifact_root).resolve() if artifact_root else None
        self.artifacts_uri = artifacts_uri
        #: run_id -> {metric key: last step logged before this attempt} (runs continued by begin_attempt)
        self._logged: dict[str, dict[str, int]] = {}

    # -- study ---------------------------------------------------------------------
    # MLflow 3's UI opens an experiment as a GenAI (traces) or a model-training (runs, charts) page
    # by this tag; studies are training runs.
    KIND_TAG = ("mlflow.experimentKind", "custom_model_development")

    def experiment_id(self, study_name: str, create: bool = True) -> str | None:
        exp = self.client.get_experiment_by_name(study_name)
        if exp is not None:
            for key, value in self._experiment_tags().items():
                if exp.tags.get(key) != value:
                    retry(self.client.set_experiment_tag, exp.experiment_id, key, value)
            return exp.experiment_id
        if not create:
            return None
        loc = artifact_location(self.uri, study_name, self.artifact_root, self.artifacts_uri)
        return retry(
            self.client.create_experiment,
            study_name,
            artifact_location=loc,
            tags={"lsbench.study": study_name, **self._experiment_tags()},
        )

    def _experiment_tags(self) -> dict[str, str]:
        """The model-training page, and lsbench's saved runs-table view (``run_status.VIEW_TAG``:
        label, status, final mAP, skipped steps; opened by ``run_status.view_url``)."""
        from .run_status import VIEW_TAG, view_state

        return {self.KIND_TAG[0]: self.KIND_TAG[1], VIEW_TAG: view_state()}

    def study_run(self, study_name: str, description: str = "", study_file: str | None = None) -> tuple[str, str]:
        """Return ``(experiment_id, parent_run_id)``, creating them on the first run of the study."""
        exp_id = self.experiment_id(study_name)
        runs = self.client.search_runs([exp_id], filter_string="tags.`lsbench.role` = 'study'", max_results=5)
        if runs:
            run_id = runs[0].info.run_id
            if runs[0].info.status != "RUNNING":
                retry(self.client.update_run, run_id, status="RUNNING")
        else:
            run = retry(
                self.client.create_run,
                exp_id,
                run_name=study_name,
                tags={"lsbench.role": "study", "lsbench.study": study_name, "mlflow.note.content": description or ""},
            )
            run_id = run.info.run_id
            if study_file and Path(study_file).is_file():
                retry(self.client.log_artifact, run_id, study_file)
        return exp_id, run_id

    def study_counts(self, parent_run_id: str, trial_ids: Iterable[str] | None = None) -> dict[str, int]:
        """``{finished, diverged, failed, pending, total}`` from the store's child runs' ``lsbench.status``.

        Counted from the store, not from one invocation's outcomes: a resumed study
        whose trials all finished earlier still says ``trials_finished N``.
        ``trial_ids`` (the study file's current trials) limits the count to them; a
        trial without a run, or running/interrupted, counts as pending.
        """
        exp_id = self.client.get_run(parent_run_id).info.experiment_id
        runs = {
            tid: r
            for tid, r in self.trial_runs(exp_id).items()
            if r.data.tags.get("mlflow.parentRunId") == parent_run_id
        }
        ids = list(dict.fromkeys(trial_ids)) if trial_ids is not None else list(runs)
        c = {"finished": 0, "diverged": 0, "failed": 0, "pending": 0}
        for tid in ids:
            status = runs[tid].data.tags.get("lsbench.status") if tid in runs else None
            c[status if status in ("finished", "diverged", "failed") else "pending"] += 1
        c["total"] = len(ids)
        return c

    def end_study(self, parent_run_id: str, trial_ids: Iterable[str] | None = None) -> dict[str, int]:
        """Log ``trials_<status>`` (from the store, :meth:`study_counts`) and end the parent run.

        FAILED when a trial failed (``lsbench run`` exits 3 then), else FINISHED;
        the tag ``lsbench.trials`` says the counts in words for the runs table.
        """
        c = self.study_counts(parent_run_id, trial_ids)
        retry(self.client.log_batch, parent_run_id, metrics=[self._metric(f"trials_{k}", v, 0) for k, v in c.items()])
        # lsbench.status too: an earlier SIGTERM left "interrupted" on the parent, which the runs
        # table would keep showing beside a FINISHED run once a re-run completed the study
        self.set_tags(
            parent_run_id,
            {
                "lsbench.trials": f"{c['finished']} finished, {c['diverged']} diverged, "
                f"{c['failed']} failed, {c['pending']} pending",
                "lsbench.status": "failed" if c["failed"] else "finished",
            },
        )
        retry(self.client.set_terminated, parent_run_id, status="FAILED" if c["failed"] else "FINISHED")
        return c

    # -- trials ---------------------------------------------------------------------
    def trial_runs(self, exp_id: str) -> dict[str, Any]:
        """``trial_id -> Run`` for the study's trial runs (latest start wins if duplicated)."""
        out: dict[str, Any] = {}
        token = None
        while True:
            page = self.client.search_runs(
                [exp_id], filter_string="tags.`lsbench.role` = 'trial'", max_results=1000, page_token=token
            )
            for r in page:
                tid = r.data.tags.get("lsbench.trial_id")
                if tid and (tid not in out or r.info.start_time > out[tid].info.start_time):
                    out[tid] = r
            token = page.token
            if not token:
                return out

    def sync_baseline_tags(self, trials, existing: dict[str, Any]) -> int:
        """Set ``lsbench.baseline`` on finished runs to the study's current choice.

        Finished trials are skipped by a re-run, so without this a study that
        moves ``baseline: true`` to another entry (same trial ids) would keep
        reporting against the old row.  ``existing``: :meth:`trial_runs`.
        Returns the number of runs whose tag changed. Runs logged before
        ``lsbench.config_id`` existed get it here too (the report pools seeds
        by it; :mod:`lossscale_bench.study.configs`).
        """
        changed = 0
        for cfg in trials:
            run = existing.get(cfg.trial_id)
            want = _bool_tag(getattr(cfg, "baseline", False))
            if run is not None and run.data.tags.get("lsbench.baseline") != want:
                self.set_tags(run.info.run_id, {"lsbench.baseline": want})
                changed += 1
            if run is not None and not run.data.tags.get("lsbench.config_id") and hasattr(cfg, "config_id"):
                self.set_tags(run.info.run_id, {"lsbench.config_id": cfg.config_id()})
        return changed

    def sync_labels(self, trials, existing: dict[str, Any]) -> list[tuple[str, str]]:
        """Give stored runs the study's current labels; return the ``(old, new)`` pairs that changed.

        A label is not part of the trial id (it names a row, not a computation), so editing
        one in the study file keeps the results; without this, ``run`` skipped the finished
        trials and ``report`` went on printing the old label with no word. The run names
        follow (``[diverged] label | id``).
        """
        from .run_status import run_name

        changed: dict[tuple[str, str], None] = {}
        for cfg in trials:
            run = existing.get(cfg.trial_id)
            old = run.data.tags.get("lsbench.label") if run is not None else None
            if run is None or old is None or old == cfg.label:
                continue
            self.set_tags(run.info.run_id, {"lsbench.label": cfg.label})
            retry(
                self.client.update_run,
                run.info.run_id,
                name=run_name(cfg.label, cfg.trial_id, run.data.tags.get("lsbench.status", "")),
            )
            changed[(old, cfg.label)] = None
        return list(changed)

    def ensure_trial_run(self, exp_id: str, parent_run_id: str, cfg, existing=None) -> str:
        """The trial's child run: the existing one (continued, not duplicated) or a new one.

        ``lsbench.baseline`` is brought up to date on a continued run: which
        entry is the baseline may change without changing the trial id.
        """
        baseline = _bool_tag(getattr(cfg, "baseline", False))
        if existing is not None:
            return self.continue_trial_run(cfg, existing)
        tags = {
            "mlflow.parentRunId": parent_run_id,
            "lsbench.role": "trial",
            "lsbench.study": cfg.study,
            "lsbench.trial_id": cfg.trial_id,
            "lsbench.status": "pending",
            "lsbench.label": cfg.label,
            "lsbench.row": str(cfg.row),
            "lsbench.precision": cfg.precision,
            "lsbench.eval_metric": cfg.eval.get("metric", "coco"),
            "lsbench.emulated": _bool_tag(is_emulated(cfg.precision)),
            "lsbench.baseline": baseline,
            # the configuration this trial is a seed of: the report pools seeds only within one
            "lsbench.config_id": cfg.config_id(),
            # a plug-in from outside the package: its name, origin and source digest (also in the trial id)
            **cfg.plugin_tags(),
        }
        run = retry(self.client.create_run, exp_id, run_name=base_run_name(cfg.label, cfg.trial_id), tags=tags)
        run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param(k, str(v)[:500]) for k, v in cfg.flat_params().items()]
        for i in range(0, len(params), 100):
            retry(self.client.log_batch, run_id, params=params[i : i + 100])
        return run_id

    def continue_trial_run(self, cfg, existing) -> str:
        """An existing trial run taken up again as the trial starts: RUNNING, its current name and
        baseline, a new attempt (:meth:`begin_attempt`); returns its run id.

        Called when the trial starts, not when the study opens its runs: a study that stops
        before the trial runs leaves its earlier result (failed, interrupted) as it was.
        """
        run_id = existing.info.run_id
        name = base_run_name(cfg.label, cfg.trial_id)
        if existing.info.status != "RUNNING" or existing.info.run_name != name:
            # a re-run of a failed trial drops its "[failed] " name until it ends again
            retry(self.client.update_run, run_id, status="RUNNING", name=name)
        baseline = _bool_tag(getattr(cfg, "baseline", False))
        if existing.data.tags.get("lsbench.baseline") != baseline:
            self.set_tags(run_id, {"lsbench.baseline": baseline})
        self.begin_attempt(run_id)
        return run_id

    def begin_attempt(self, run_id: str) -> None:
        """A continued run's next attempt starts a clean record (:mod:`.attempts`): the earlier
        attempt's error is set aside (tag ``lsbench.previous_error``, artifact
        ``failed_attempts/<n>/error.txt``), its per-attempt tags dropped, and the steps it
        logged are not logged again (:meth:`log_metrics`)."""
        from .attempts import ATTEMPT_TAGS, archive_dir, failed_attempts, last_steps

        run = self.client.get_run(run_id)
        tags = run.data.tags
        error = tags.get("lsbench.error")
        if error:
            n = failed_attempts(tags) + 1
            self._set_aside_traceback(run, archive_dir(n), error)
            self.set_tags(run_id, {"lsbench.previous_error": error, "lsbench.failed_attempts": n})
        for key in ATTEMPT_TAGS:
            if key in tags:
                retry(self.client.delete_tag, run_id, key)
        if tags.get("lsbench.status") not in (None, "pending"):
            self.set_tags(run_id, {"lsbench.status": "pending"})  # not "failed" while it waits to run again
        self._logged[run_id] = last_steps(run)

    def _set_aside_traceback(self, run, folder: str, error: str) -> None:
        """Move the run's ``error.txt`` to ``folder/error.txt`` (copied first, then deleted where the
        artifact store can delete); without one, write ``error`` there: every failure stays readable."""
        import tempfile

        run_id = run.info.run_id
        has_file = any(a.path == "error.txt" for a in retry(self.client.list_artifacts, run_id))
        with tempfile.TemporaryDirectory() as tmp:
            if has_file:
                local = Path(retry(self.client.download_artifacts, run_id, "error.txt", tmp))
            else:
                local = Path(tmp) / "error.txt"
                local.write_text(error)
            self.log_artifact(run_id, str(local), folder)
        if has_file:
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

            repo = get_artifact_repository(run.info.artifact_uri, tracking_uri=self.uri)
            retry(repo.delete_artifacts, "error.txt")

    @staticmethod
    def _metric(key: str, value: float, step: int):
        from mlflow.entities import Metric

        return Metric(key, float(value), int(time.time() * 1000), int(step))

    def log_metrics(self, run_id: str, items: Iterable[tuple[str, float, int]]) -> int:
        """Log ``(key, value, step)`` triples; returns how many were written.

        On a run continued by :meth:`begin_attempt`, a step an earlier attempt already logged
        for that key is not logged again (:func:`.attempts.new_points` says why).
        """
        logged = self._logged.get(run_id)
        if logged:
            from .attempts import new_points

            items = new_points(items, logged)
        metrics = [self._metric(k, v, s) for k, v, s in items]
        for i in range(0, len(metrics), 1000):
            retry(self.client.log_batch, run_id, metrics=metrics[i : i + 1000])
        return len(metrics)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        clean = [
            RunTag(
                k, "" if v is None else (f"{v:.6g}" if isinstance(v, float) and not math.isnan(v) else str(v))[:5000]
            )
            for k, v in tags.items()
        ]
        if clean:
            retry(self.client.log_batch, run_id, tags=clean)

    def log_artifact(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            retry(self.client.log_artifact, run_id, path, artifact_path)

    def artifacts_elsewhere(self, run_id: str) -> bool:
        """Whether the run's artifacts live away from this machine's disk (an MLflow server's store,
        ``s3://``, ...): then a finished trial's folder holds nothing that is not in the store."""
        from .store import ARTIFACT_SCHEME

        uri = self.client.get_run(run_id).info.artifact_uri or ""
        return not uri.startswith(("file:", f"{ARTIFACT_SCHEME}:", "/"))

    def end_trial(self, run_id: str, status: str) -> None:
        """End a trial's run so that the runs table shows how it ended (``run_status``).

        finished -> FINISHED; diverged and failed -> FAILED with ``[diverged] `` /
        ``[failed] `` before the run name; the description (``mlflow.note.content``)
        says why and at which step. Reads the run's tags (label, diverged step,
        error) back from the store: they arrived before the outcome.
        """
        from .run_status import mlflow_status, note, run_name

        run = self.client.get_run(run_id)
        tags, metrics = run.data.tags, run.data.metrics
        if tags.get("lsbench.status") != status:
            self.set_tags(run_id, {"lsbench.status": status})
        # the status right after the tag: a driver killed between the two leaves them disagreeing
        retry(self.client.set_terminated, run_id, status=mlflow_status(status))
        label, tid = tags.get("lsbench.label"), tags.get("lsbench.trial_id")
        self.set_tags(run_id, {"mlflow.note.content": note(status, tags, metrics)})
        if label and tid:
            retry(self.client.update_run, run_id, name=run_name(label, tid, status))

    def end_interrupted(self, run_id: str) -> None:
        """SIGINT/SIGTERM stopped the study: the run ends KILLED, tagged ``lsbench.status=interrupted``.

        Not RUNNING (nothing runs it any more), not FAILED (nothing went wrong with
        it), and the tag is not in ``TERMINAL``: the next run of the study resumes it.
        """
        self.set_tags(run_id, {"lsbench.status": "interrupted"})
        retry(self.client.set_terminated, run_id, status="KILLED")


def study_view_urls(uri: str, base_url: str) -> list[tuple[str, str]]:
    """``(study, url)`` for every study in the store: its runs table in the model-training view
    with lsbench's saved view (``run_status.view_url``). Never creates a store: a SQLite file
    that does not exist gives ``[]``. The view tag is refreshed on studies that lack it."""
    path = sqlite_path(uri)
    if path is not None and not path.exists():
        return []
    from .run_status import view_url

    tracker = Tracker(uri)
    out = []
    for exp in tracker.client.search_experiments():
        name = exp.tags.get("lsbench.study")
        if name:
            try:  # stores made before the view existed get it; a read-only store keeps its link
                tracker.experiment_id(exp.name, create=False)
            except Exception:  # noqa: BLE001
                pass
            out.append((name, view_url(base_url, exp.experiment_id)))
    return out


def set_study_tags(uri: str, study_name: str, tags: dict[str, str]) -> bool:
    """Set ``tags`` on the parent run of study ``study_name`` in the store at ``uri`` (replacing those of the
    same key); False when the store holds no such study yet."""
    client = store_client(uri)
    exp = client.get_experiment_by_name(study_name)
    if exp is None:
        return False
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`lsbench.role` = 'study'", max_results=1)
    if not parents:
        return False
    for key, value in tags.items():
        client.set_tag(parents[0].info.run_id, key, value)
    return True
