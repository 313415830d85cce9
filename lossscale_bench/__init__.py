"""lossscale_bench: mixed-precision loss-scaling studies of SSD object detectors.

Heavy dependencies (torch, ray, mlflow) are imported by the modules that need
them, never here, so that ``lsbench validate`` and ``--help`` stay instant.

Layers. Each module imports only from its own layer or the layers below it
(``tests/test_layers.py`` reads the import graph and checks this, and that
there is no circle). Where new code goes:

0. ``schema``: ``core`` (allowed names, exit codes, number-format ranges, message helpers, the
   writable-folder check, the CPU pins, and the tables of ``LSBENCH_*`` variables and logged names the
   reference pages are generated from), ``dataset_files`` (how VOC/COCO annotations and layouts are
   read: below both ``study`` and ``data``, which read the same files by the same rules), ``study``
   (the study-file schema, loading, grid and trial ids; no torch).
1. ``components``: ``numerics`` (the rounding kernels), ``precision`` (number formats, the emulation,
   a new precision), ``data``, ``models``, ``scaling`` (a new loss scaler), ``backends`` (a new device),
   ``evaluation``. They know the schema's names, not each other's internals, and nothing about the loop.
2. ``engine``: the training loop, its hooks and ``sink`` (the interface a trial reports through). It
   knows only interfaces:
   ``LossScaler``, ``Backend``, ``Precision``, and the replica-sync object the
   launcher hands it (``grad_sync(params)``, ``grad_sync.mean(t)``).
3. ``trial``: one trial, built from its ``TrialConfig``; no Ray, no MLflow.
4. ``orchestration``: two packages. ``orchestration/`` runs a study:
   ``study_runner`` (``run_study``, in-process executor), ``tune_runner`` (Ray Tune),
   ``funnel`` (the driver's MLflow callback), ``outcomes``, ``progress``,
   ``signals``, ``cluster`` (joining and checking a Ray cluster), ``placement``
   (resource arithmetic), ``tune_sink``, ``distributed`` (Ray Train
   multi-device trials), ``replica_sync`` (what the loop's ``grad_sync`` is).
   ``tracking/`` is the MLflow store: ``tracker`` (the only MLflow writer),
   ``store`` (opening a store, its faults, store-relative artifacts),
   ``run_status`` (how a trial's end shows in the MLflow UI), ``attempts`` (a
   rerun's clean record), ``mlflow_sink``.
5. ``reporting``: the ``report`` package (runs -> summary -> one renderer per
   format, plots; a new report format goes in ``report/renderers``).
6. ``cli``: ``lsbench`` commands, and ``seed_rounds`` (``lsbench run`` of a study whose seeds are added
   until its comparisons are decided: it drives the runner and reads the report's verdicts).
"""

__version__ = "0.1.0"

#: (layer name, top-level modules/packages in it); ``name*`` matches a prefix
LAYERS = (
    ("schema", ("core", "dataset_files",
                "study")),
    ("components", ("numerics", "data", "models", "precision", "scaling", "backends",
                    "evaluation")),
    ("engine", ("engine",)),
    ("trial", ("trial",)),
    ("orchestration", ("orchestration", "tracking")),
    ("reporting", ("report",)),
    ("cli", ("cli", "__main__", "seed_rounds")),
)
