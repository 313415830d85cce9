"""lossscale_bench: mixed-precision loss-scaling studies of SSD object detectors.

Heavy dependencies (torch, ray, mlflow) are imported by the modules that need
them, never here, so that ``lsbench validate`` and ``--help`` stay instant.

Layers. Each module imports only from its own layer or the layers below it
(``tests/test_layers.py`` reads the import graph and checks this, and that
there is no circle). Where new code goes:

0. ``schema``: ``registry`` (allowed names), ``formats`` (number formats),
   ``sink`` (the interface a trial reports through), ``study`` (the study-file
   schema, loading, grid and trial ids; no torch).
1. ``components``: ``data``, ``models``, ``precision`` (a new precision),
   ``scaling`` (a new loss scaler), ``backends`` (a new device),
   ``telemetry``, ``evaluation``. They know the schema's names, not each other's
   internals, and nothing about the loop.
2. ``engine``: the training loop and its hooks. It knows only interfaces:
   ``LossScaler``, ``Backend``, ``Precision``, and the replica-sync object the
   launcher hands it (``grad_sync(params)``, ``grad_sync.mean(t)``).
3. ``trial``: one trial, built from its ``TrialConfig``; no Ray, no MLflow.
4. ``orchestration``: ``placement`` (resource arithmetic), ``tune_sink`` (the sink
   both Ray paths use), ``replica_sync`` (what the loop's ``grad_sync`` is),
   ``sweep`` (Ray Tune), ``distributed`` (Ray Train multi-device trials),
   ``tracking`` (the only MLflow writer), ``store`` (opening a store, its faults,
   store-relative artifacts), ``run_status`` (how a trial's end shows in the MLflow UI).
5. ``reporting``: the ``report`` package (runs -> summary -> one renderer per
   format, plots; a new report format goes in ``report/renderers``).
6. ``cli``: ``lsbench`` commands.
"""

__version__ = "0.1.0"

#: (layer name, top-level modules/packages in it); ``name*`` matches a prefix
LAYERS = (
    ("schema", ("registry", "sink", "study")),
    ("components", ("formats", "numerics", "data", "models", "precision", "scaling", "backends", "telemetry",
                    "evaluation")),
    ("engine", ("engine",)),
    ("trial", ("trial",)),
    ("orchestration", ("placement", "tune_sink", "replica_sync", "sweep", "distributed", "tracking",
                       "store", "run_status")),
    ("reporting", ("report",)),
    ("cli", ("cli", "__main__")),
)
