"""The ground floor: small torch-free modules that every other package may import.

* :mod:`.registry`: the names a study file may use (models, methods, precisions, backends, ...).
* :mod:`.float_ranges`: the number formats' ranges from their bit layouts (validation bounds scale
  options by them; :mod:`lossscale_bench.precision.formats` builds its torch formats on them).
* :mod:`.exit_codes`: ``lsbench``'s exit codes.
* :mod:`.wording`: one-line message helpers (``did you mean``).
* :mod:`.writable`: whether a folder can be written, checked before a study trains.
* :mod:`.portable`: the environment pins that make CPU kernels repeatable across x86 machines.
* :mod:`.env_vars`: every ``LSBENCH_*`` environment variable the package reads, described.
* :mod:`.logged_names`: every metric and tag a trial or study logs, described.
* :mod:`.uninterrupted`: calls (store writes) that a stop signal lets finish before it raises.

Nothing here imports torch, Ray or MLflow, nor any other package of ``lossscale_bench``.
"""
