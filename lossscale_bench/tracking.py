"""MLflow conventions of DESIGN.md; the only module that imports mlflow.

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
from pathlib import Path
from typing import Any, Iterable

TERMINAL = ("finished", "diverged")


class StoreError(RuntimeError):
    """The tracking store cannot be used (corrupt, read-only, full, unreachable, bad URI).

    The message is one line naming the store and the cause; ``lsbench`` exits 4 on it.
    """


def is_emulated(precision) -> bool:
    """``fp16-emulated``, ``fp8-emulated``, ...: a CPU emulation, which the report marks †."""
    return str(precision).endswith("-emulated")


def _bool_tag(value) -> str:
    """Tags are strings; booleans are written ``true``/``false`` as in the study file."""
    return "true" if value else "false"


def default_tracking_uri(runs_dir: str | Path) -> str:
    """``sqlite:///<absolute>/mlflow.db``: absolute because Ray trials run in their own directories."""
    return f"sqlite:///{Path(runs_dir).expanduser().resolve() / 'mlflow.db'}"


def resolve_tracking_uri(uri: str | None, runs_dir: str | Path) -> str:
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        Path(runs_dir).expanduser().resolve().mkdir(parents=True, exist_ok=True)
        return default_tracking_uri(runs_dir)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        # make relative SQLite paths absolute, for the same reason
        return f"sqlite:///{Path(uri[len('sqlite:///'):]).expanduser().resolve()}"
    return uri


def _retry(fn, *args, attempts: int = 8, **kwargs):
    delay = 0.05
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            if "locked" not in str(exc).lower() or i == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


class Tracker:
    """Study- and trial-level bookkeeping on one MLflow store."""

    def __init__(self, tracking_uri: str, artifact_root: str | Path | None = None) -> None:
        import logging

        from mlflow.tracking import MlflowClient

        # Alembic/MLflow print migration chatter on first use of a store.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.artifact_root = Path(artifact_root).resolve() if artifact_root else None

    # -- study ---------------------------------------------------------------------
    # MLflow 3's UI opens an experiment as a GenAI (traces) or a model-training (runs, charts) page
    # by this tag; studies are training runs.
    KIND_TAG = ("mlflow.experimentKind", "custom_model_development")

    def experiment_id(self, study_name: str, create: bool = True) -> str | None:
        exp = self.client.get_experiment_by_name(study_name)
        if exp is not None:
            if exp.tags.get(self.KIND_TAG[0]) is None:
                _retry(self.client.set_experiment_tag, exp.experiment_id, *self.KIND_TAG)
            return exp.experiment_id
        if not create:
            return None
        loc = (self.artifact_root / study_name).as_uri() if self.artifact_root else None
        return _retry(self.client.create_experiment, study_name, artifact_location=loc,
                      tags={"lsbench.study": study_name, self.KIND_TAG[0]: self.KIND_TAG[1]})

    def study_run(self, study_name: str, description: str = "", study_file: str | None = None) -> tuple[str, str]:
        """Return ``(experiment_id, parent_run_id)``, creating them on the first run of the study."""
        exp_id = self.experiment_id(study_name)
        runs = self.client.search_runs([exp_id], filter_string="tags.`lsbench.role` = 'study'", max_results=5)
        if runs:
            run_id = runs[0].info.run_id
            if runs[0].info.status != "RUNNING":
                _retry(self.client.update_run, run_id, status="RUNNING")
        else:
            run = _retry(self.client.create_run, exp_id, run_name=study_name,
                         tags={"lsbench.role": "study", "lsbench.study": study_name,
                               "mlflow.note.content": description or ""})
            run_id = run.info.run_id
            if study_file and Path(study_file).is_file():
                _retry(self.client.log_artifact, run_id, study_file)
        return exp_id, run_id

    def end_study(self, parent_run_id: str, counts: dict[str, int]) -> None:
        _retry(self.client.log_batch, parent_run_id,
               metrics=[self._metric(f"trials_{k}", v, 0) for k, v in counts.items()])
        _retry(self.client.set_terminated, parent_run_id, status="FINISHED")

    # -- trials ---------------------------------------------------------------------
    def trial_runs(self, exp_id: str) -> dict[str, Any]:
        """``trial_id -> Run`` for the study's trial runs (latest start wins if duplicated)."""
        out: dict[str, Any] = {}
        token = None
        while True:
            page = self.client.search_runs([exp_id], filter_string="tags.`lsbench.role` = 'trial'",
                                           max_results=1000, page_token=token)
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

    def ensure_trial_run(self, exp_id: str, parent_run_id: str, cfg, existing=None) -> str:
        """The trial's child run: the existing one (continued, not duplicated) or a new one.

        ``lsbench.baseline`` is brought up to date on a continued run: which
        entry is the baseline may change without changing the trial id.
        """
        baseline = _bool_tag(getattr(cfg, "baseline", False))
        if existing is not None:
            run_id = existing.info.run_id
            if existing.info.status != "RUNNING":
                _retry(self.client.update_run, run_id, status="RUNNING")
            if existing.data.tags.get("lsbench.baseline") != baseline:
                self.set_tags(run_id, {"lsbench.baseline": baseline})
            return run_id
        tags = {"mlflow.parentRunId": parent_run_id, "lsbench.role": "trial", "lsbench.study": cfg.study,
                "lsbench.trial_id": cfg.trial_id, "lsbench.status": "pending", "lsbench.label": cfg.label,
                "lsbench.row": str(cfg.row), "lsbench.precision": cfg.precision,
                "lsbench.eval_metric": cfg.eval.get("metric", "coco"),
                "lsbench.emulated": _bool_tag(is_emulated(cfg.precision)), "lsbench.baseline": baseline,
                # the configuration this trial is a seed of: the report pools seeds only within one
                "lsbench.config_id": cfg.config_id()}
        run = _retry(self.client.create_run, exp_id, run_name=f"{cfg.label} | {cfg.trial_id}", tags=tags)
        run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param(k, str(v)[:500]) for k, v in cfg.flat_params().items()]
        for i in range(0, len(params), 100):
            _retry(self.client.log_batch, run_id, params=params[i:i + 100])
        return run_id

    @staticmethod
    def _metric(key: str, value: float, step: int):
        from mlflow.entities import Metric

        return Metric(key, float(value), int(time.time() * 1000), int(step))

    def log_metrics(self, run_id: str, items: Iterable[tuple[str, float, int]]) -> int:
        metrics = [self._metric(k, v, s) for k, v, s in items]
        for i in range(0, len(metrics), 1000):
            _retry(self.client.log_batch, run_id, metrics=metrics[i:i + 1000])
        return len(metrics)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        clean = [RunTag(k, "" if v is None else (f"{v:.6g}" if isinstance(v, float) and not math.isnan(v)
                                                 else str(v))[:5000]) for k, v in tags.items()]
        if clean:
            _retry(self.client.log_batch, run_id, tags=clean)

    def log_artifact(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            _retry(self.client.log_artifact, run_id, path, artifact_path)

    def end_trial(self, run_id: str, status: str) -> None:
        _retry(self.client.set_terminated, run_id, status="FAILED" if status == "failed" else "FINISHED")


class MlflowSink:
    """A ``Sink`` writing straight to one child run (in-process runs; the sweep funnels instead)."""

    def __init__(self, tracker: Tracker, run_id: str) -> None:
        self.tracker = tracker
        self.run_id = run_id
        self.count = 0

    def metrics(self, items):
        self.count += self.tracker.log_metrics(self.run_id, items)

    def tags(self, tags):
        self.tracker.set_tags(self.run_id, tags)

    def artifact(self, path, artifact_path=None):
        self.tracker.log_artifact(self.run_id, path, artifact_path)

    def flush(self):
        pass
