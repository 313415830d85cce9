"""lossscale_bench: mixed-precision loss-scaling studies of SSD object detectors.

Heavy dependencies (torch, ray, mlflow) are imported by the modules that need
them, never here, so that ``lsbench validate`` and ``--help`` stay instant.

Floors. Each module imports only from its own floor or the floors below, with no circle; the floors
are written once, in ``FLOORS`` of ``tests/test_structure.py``, which checks them on the import graph
(with the limits on module and function length and on shared underscore names). Bottom to top:

1. ``core`` (allowed names, number-format ranges, exit codes, small torch-free modules) and
   ``numerics`` (the rounding kernels).
2. ``dataset_files``: how VOC/COCO annotations and layouts are read and where the synthetic set is
   cached, below both ``study`` and ``data``, which read the same files by the same rules.
3. ``study``: the study file (schema, loading, grid, trial ids, the method and precision entries);
   no torch.
4. The components a trial is built from: ``precision`` (formats, the emulation, the per-layer
   census), ``data``, ``models``, ``evaluation``, ``backends``; then ``scaling`` (a new loss scaler;
   the per-layer methods share ``scaling.per_layer``), which reads the precision's formats.
5. ``engine``: the training loop, its hooks and the sink a trial reports through. It knows only
   interfaces: ``LossScaler``, ``Backend``, ``Precision``, ``Sink``, and the replica-sync object the
   launcher hands it (``grad_sync(params)``, ``grad_sync.mean(t)``).
6. ``trial``: one trial, built from its ``TrialConfig``; no Ray, no MLflow.
7. ``tracking`` (the MLflow store; ``tracker`` is its only writer) and ``orchestration`` (running a
   study in-process or on Ray).
8. ``report``: runs -> summary -> one renderer per format, plots.
9. ``cli``: ``lsbench`` commands.
"""

__version__ = "0.1.0"
