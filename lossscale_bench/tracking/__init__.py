"""Tracking: everything lsbench writes to, or reads the health of, an MLflow store.

Why a package of its own: the store is the study's record, and the code that
touches it has separate jobs, one module each. ``store`` opens a store
and names its faults (no MLflow writes; the ``lsbench-store:`` artifact
resolver that pyproject.toml's entry point names); ``artifacts`` says where a new study's
artifacts go (an MLflow server's own store, beside SQLite, or ``--artifacts-uri``); ``store_faults`` names a
fault that appears after opening (a disk that fills up mid-study). ``client`` is the
MLflow client on a store (each call on a database store made whole before a stop signal
raises, calls retried while SQLite is locked). ``tracker`` is the one writer of runs
(``Tracker``: experiments, parent and trial runs, batched writes). ``run_status`` is pure text: how a trial's end shows in the
MLflow UI. ``attempts`` is pure rules too: what a continued run's next attempt
does to the record of the earlier one (error set aside, repeated steps not
logged twice). ``mlflow_sink`` is the sink of an in-process trial. ``ui_server`` starts
and stops ``mlflow server`` for ``lsbench ui``.

It sits on the floor of orchestration (``FLOORS`` in ``tests/test_structure.py``): the study
runner and the CLI use it; the trial and the engine never do (they report
through ``lossscale_bench.engine.sink``). MLflow is imported inside functions only,
so importing this package stays instant. The names below are what callers
(cli, tests, benchmarks) use; code inside the package imports the modules.
"""

from .mlflow_sink import MlflowSink
from .store import (
    StoreError,
    StoreMissing,
    default_tracking_uri,
    open_store,
    relative_artifact_location,
    resolve_tracking_uri,
    sqlite_path,
)
from .store_faults import store_error
from .tracker import TERMINAL, Tracker, set_study_tags, study_view_urls

__all__ = [
    "MlflowSink",
    "StoreError",
    "StoreMissing",
    "TERMINAL",
    "Tracker",
    "default_tracking_uri",
    "open_store",
    "relative_artifact_location",
    "resolve_tracking_uri",
    "sqlite_path",
    "store_error",
    "set_study_tags",
    "study_view_urls",
]
