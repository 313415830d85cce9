"""MLflow store -> one pandas row per trial: :func:`load_runs` and what it needs.

The report reads the MLflow store, never training logs.  The store contract
(written by the trial code, see docs/DESIGN "MLflow conventions"):

* one experiment per study, named by the study;
* one parent run per study (``lsbench.role=study``);
* one child run per trial (``lsbench.role=trial``) tagged ``lsbench.study``,
  ``lsbench.trial_id``, ``lsbench.status`` (running | finished | diverged |
  failed; any other value, e.g. pending, reads as not done yet),
  ``lsbench.diverged_step``, ``lsbench.label``, ``lsbench.row``,
  ``lsbench.precision``, ``lsbench.eval_metric``, ``lsbench.baseline``
  (``true`` on the trials of the study's ``baseline: true`` entry),
  ``lsbench.config_id`` (the configuration the trial is a seed of; runs
  without it get one derived from their params, see
  :mod:`lossscale_bench.study.configs`); params ``model``,
  ``batch_size``, ``seed``, ``precision``, ``scaling.method``, ...; metrics
  ``final_map``, ``final_map_50``, ``best_map`` (fractions), plus step and
  eval metrics.

Only :func:`load_runs` touches MLflow, and it imports it lazily so that the
rest of the package (and ``lsbench --help``) does not pay for the import.

Part of the summary layer (with :mod:`lossscale_bench.report.summary`, which
builds on it): no rendering, no plots.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from ..core.plugins import PluginError
from ..study import plugins
from ..study.configs import config_params, run_config_id, setting_id

__all__ = [
    "ReportError",
    "load_runs",
    "derive_label",
    "model_name",
    "RUN_COLUMNS",
    "STATUSES",
    "TAG",
    "is_true",
    "isna",
    "to_int",
]

# --------------------------------------------------------------------------
# constants

STATUSES = ("running", "finished", "diverged", "failed")

TAG = "lsbench."
# the columns load_runs always returns, in this order
RUN_COLUMNS = [
    "study",
    "trial_id",
    "run_id",
    "status",
    "label",
    "row",
    "model",
    "batch_size",
    "seed",
    "precision",
    "method",
    "baseline",
    "final_map",
    "final_map_50",
    "best_map",
    "map",
    "map_50",
    "diverged_step",
    "eval_metric",
    "experiment_id",
    "run_name",
    "mlflow_status",
    "start_time",
    "end_time",
    "config_id",  # the configuration (identity without the seed): seeds pool only within one
    "setting_id",  # the study-level part of it (one version of the study file), no paths
    "config_params",  # dict: the params that make the configuration (to say how two differ)
    "data_dropped",  # dict split -> {reason or 'unknown class NAME': count}: what bad_annotations: drop dropped
]
_INT_COLUMNS = ("row", "batch_size", "seed", "diverged_step")
_FLOAT_COLUMNS = ("final_map", "final_map_50", "best_map", "map", "map_50")


class ReportError(Exception):
    """A report cannot be produced; the message is one line for the user."""


# --------------------------------------------------------------------------
# loading


def to_int(value) -> int | None:
    """``value`` (a tag or parameter, often a string) as an int, or None where it is not one."""
    if value is None:
        return None
    try:
        f = float(str(value).strip())
    except ValueError:
        return None
    if math.isnan(f) or math.isinf(f) or f != int(f):
        return None
    return int(f)


def _param_value(text: str):
    """An MLflow param string back as the value it was logged from (``'128.0'`` -> 128.0,
    ``'True'``/``'true'`` -> True, ``'None'`` -> None); anything else stays a string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null", ""):
        return None
    try:
        f = float(text)
    except ValueError:
        return text
    return int(f) if f.is_integer() and "." not in text and "e" not in low else f


def derive_label(params: Mapping[str, str], precision: str | None = None) -> str:
    """A row label from the scaling params, for runs without ``lsbench.label``: the study's own
    default label (:func:`lossscale_bench.study.methods.default_label`) of the scaling the run
    logged, so a stored run and a new one of the same entry read alike."""
    from ..study.methods import default_label

    scaling = {
        k[len("scaling.") :]: _param_value(str(v))
        for k, v in params.items()
        if k.startswith("scaling.") and v is not None
    }
    scaling["method"] = str(scaling.get("method") or "none").lower()
    return default_label(scaling, (precision or params.get("precision") or "").lower())


def is_true(value) -> bool:
    """A tag or column value meaning yes: ``true`` (as tracking writes it), True, 1, ``yes``."""
    if value is None or isna(value):
        return False
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _status(tag_status: str | None, mlflow_status: str) -> str:
    mlflow_status = (mlflow_status or "").upper()
    if tag_status:
        s = tag_status.strip().lower()
        # a trial whose process died leaves the tag at "running"; MLflow knows better
        if s in ("running", "pending") and mlflow_status in ("FAILED", "KILLED"):
            return "failed"
        return s
    return {"FINISHED": "finished", "FAILED": "failed", "KILLED": "failed"}.get(mlflow_status, "running")


def _run_record(run) -> dict:
    info, data = run.info, run.data
    tags, params, metrics = data.tags, data.params, data.metrics
    precision = tags.get(TAG + "precision") or params.get("precision")
    label = tags.get(TAG + "label") or derive_label(params, precision)
    rec = {
        "study": tags.get(TAG + "study"),
        "trial_id": tags.get(TAG + "trial_id") or info.run_id,
        "run_id": info.run_id,
        "status": _status(tags.get(TAG + "status"), info.status),
        "label": label,
        "row": to_int(tags.get(TAG + "row")),
        "model": params.get("model"),
        "batch_size": to_int(params.get("batch_size")),
        "seed": to_int(params.get("seed")),
        "precision": precision,
        "method": params.get("scaling.method"),
        "baseline": is_true(tags.get(TAG + "baseline")),
        "diverged_step": to_int(tags.get(TAG + "diverged_step")),
        "eval_metric": tags.get(TAG + "eval_metric") or params.get("eval.metric"),
        "experiment_id": info.experiment_id,
        "run_name": info.run_name,
        "mlflow_status": info.status,
        "start_time": info.start_time,
        "end_time": info.end_time,
        "config_id": run_config_id(tags, params),
        "setting_id": setting_id(params),
        "config_params": config_params(params),
        "data_dropped": _data_dropped(tags),
    }
    # every metric's latest value under its own name (final_map, loss_scale, ...)
    for key, value in metrics.items():
        rec[key if key not in rec else f"metric.{key}"] = value
    return rec


def _data_dropped(tags: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """What the trial's loaders dropped (``dataset.bad_annotations: drop``), by split, from its data tags."""
    import json

    out: dict[str, dict[str, int]] = {}
    for split in ("train", "val"):
        counts: dict[str, int] = {}
        for attr, prefix in (("dropped_annotations", ""), ("unknown_objects", "unknown class ")):
            try:
                found = json.loads(tags.get(f"{TAG}data.{split}.{attr}") or "{}")
            except ValueError:
                continue
            for k, v in found.items():
                if (
                    attr == "dropped_annotations"
                    and k == "unknown_class"
                    and tags.get(f"{TAG}data.{split}.unknown_objects")
                ):
                    continue  # counted by name instead
                name = f"{prefix}{k!s}" if prefix else str(k).replace("_", " ")
                counts[name] = counts.get(name, 0) + int(v)
        if counts:
            out[split] = counts
    return out


def _empty_runs() -> pd.DataFrame:
    return _typed(pd.DataFrame({c: [] for c in RUN_COLUMNS}))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for c in RUN_COLUMNS:
        if c not in df.columns:
            df[c] = None
    for c in _INT_COLUMNS:
        df[c] = pd.array([to_int(v) if v is not None and not isna(v) else None for v in df[c]], dtype="Int64")
    for c in _FLOAT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in ("start_time", "end_time"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df["baseline"] = [is_true(v) for v in df["baseline"]]  # runs logged before the tag existed: no
    df["baseline"] = df["baseline"].astype(bool)
    extra = [c for c in df.columns if c not in RUN_COLUMNS]
    return df[RUN_COLUMNS + extra]


def isna(value) -> bool:
    """``pd.isna`` for one value, False for values it cannot judge (lists, dicts)."""
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _quote(value: str) -> str | None:
    """Quote a value for an MLflow filter string, or None if it cannot be."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    return None


def _all_experiments(client) -> list:
    from mlflow.entities import ViewType

    out, token = [], None
    while True:
        page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _search_trials(client, experiment_ids: list[str], extra_filter: str = "") -> list:
    from mlflow.entities import ViewType

    flt = f"tags.`{TAG}role` = 'trial'" + (f" and {extra_filter}" if extra_filter else "")
    runs, token = [], None
    while True:
        page = client.search_runs(
            experiment_ids=experiment_ids,
            filter_string=flt,
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=5000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def load_runs(tracking_uri: str, study: str | None = None) -> pd.DataFrame:
    """One row per trial child run of ``study`` (all studies when None).

    When one ``trial_id`` has several runs (a resumed or restored trial),
    only the latest by start time is kept.  Runs are read with one paged
    ``search_runs`` pass, no per-run calls.  Columns: see ``RUN_COLUMNS``;
    every logged metric also appears with its latest value under its own name.
    Unknown study -> :class:`ReportError`.
    """
    try:
        from mlflow import MlflowClient
    except ImportError as e:  # pragma: no cover - mlflow is a dependency
        raise ReportError(f"mlflow is not installed: {e}") from None

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        if study is None:
            experiments = _all_experiments(client)
            runs = _search_trials(client, [e.experiment_id for e in experiments]) if experiments else []
        else:
            exp = client.get_experiment_by_name(study)
            if exp is not None and exp.lifecycle_stage == "active":
                runs = _search_trials(client, [exp.experiment_id])
            else:
                # the experiment may have been named differently; the tag decides
                experiments = _all_experiments(client)
                q = _quote(study)
                runs = []
                if experiments and q is not None:
                    runs = _search_trials(client, [e.experiment_id for e in experiments], f"tags.`{TAG}study` = {q}")
                if not runs:
                    names = sorted(e.name for e in experiments if e.name != "Default")
                    known = ", ".join(names) if names else "(none)"
                    raise ReportError(f"no study named {study!r} in {tracking_uri}; studies: {known}")
    except ReportError:
        raise
    except Exception as e:  # MlflowException, sqlalchemy errors, connection errors
        from ..tracking.store_faults import store_error

        fault = store_error(e, tracking_uri)  # a store that cannot be used (locked, corrupt): exit 4, as for run
        if fault is not None:
            raise fault from None
        msg = " ".join(str(e).split())
        raise ReportError(f"cannot read MLflow store {tracking_uri}: {type(e).__name__}: {msg[:300]}") from None

    if not runs:
        return _empty_runs()
    df = pd.DataFrame.from_records([_run_record(r) for r in runs])
    if study is not None:
        # runs in the study's experiment that do not say which study they belong to are its own
        df["study"] = df["study"].fillna(study)
        df = df[df["study"] == study]
    else:
        # fall back to the experiment's name, which is the study's name by convention
        exp_names = {e.experiment_id: e.name for e in experiments}
        df["study"] = df["study"].fillna(df["experiment_id"].map(exp_names))
    df = _typed(df)
    df = df.sort_values(["start_time", "run_id"], kind="stable", na_position="first")
    df = df.drop_duplicates(subset=["study", "trial_id"], keep="last")
    df = df.sort_values(["study", "row", "trial_id"], kind="stable", na_position="last")
    return df.reset_index(drop=True)


def model_name(model: str | None) -> str:
    """The report's name of a model: its registry entry's display name (an import path or a name no
    longer registered: as stored)."""
    if model is None or isna(model):
        return "?"
    if str(model) not in plugins.names("model"):
        return str(model)
    try:
        return plugins.entry("model", str(model)).display_name
    except PluginError:
        return str(model)
