"""Orchestration: running a study's trials, here or on a Ray cluster, and recording how each ended.

Why these modules, each with one job (a floor above ``trial``, beside ``tracking``;
``FLOORS`` in ``tests/test_structure.py``):

- ``study_runner``: :func:`run_study`, a row of named steps (data, store,
  cluster, runs, trials), and the in-process executor.
- ``tune_runner``: the Ray executor, the study's trials as one Tune run.
- ``funnel``: the driver's Tune callback, the only MLflow writer for Ray trials.
- ``outcomes``: :class:`StudyResult` and how a trial's end is recorded (both executors).
- ``progress``: the console lines. ``signals``: SIGINT/SIGTERM as :class:`Interrupted`, at safe points.
- ``rounds``: a seed plan's rounds under one signal guard, its parent run ended once.
- ``cluster``: joining ``--address`` and refusing a cluster that can never run the study.
- ``placement``: resource arithmetic (no Ray). ``tune_sink``: the sink of a trial inside Tune.
- ``runs_lock``: one runner per runs folder and SQLite store (an OS file lock).
- ``environment``: the environment variables a run reads, refused before training when misspelt.
- ``distributed``: multi-device trials (Ray Train); ``replica_sync``: its ``grad_sync``.

Ray and MLflow are imported inside functions (``funnel`` only ever lazily, by
``tune_runner``), so importing this package costs nothing heavy: the CLI's dry
run uses ``placement``. The names below are what ``cli``, tests and benchmarks use.
"""

from .cluster import ClusterUnavailable, Infeasible, check_feasible, cluster_nodes, connect_ray, probe_address
from .outcomes import StudyResult
from .placement import placement_text
from .progress import Progress
from .runs_lock import RunsFolderBusy
from .signals import Interrupted
from .study_runner import run_study, study_dir
from .tune_sink import TuneSink

__all__ = [
    "ClusterUnavailable",
    "Infeasible",
    "Interrupted",
    "Progress",
    "RunsFolderBusy",
    "StudyResult",
    "TuneSink",
    "check_feasible",
    "cluster_nodes",
    "connect_ray",
    "placement_text",
    "probe_address",
    "run_study",
    "study_dir",
]
