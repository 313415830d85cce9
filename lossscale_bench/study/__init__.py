"""Study files: schema, YAML loading with field-precise errors, grid expansion.

A study file (YAML) names a grid: ``model × batch_size × scaling entry ×
seed``. A scaling entry may override ``precision``, ``model`` or
``batch_size`` for itself (the FP32 baseline row), and at most one entry
may say ``baseline: true`` (the row the report tests the others against;
without one, the report uses the first fp32 row). :meth:`Study.trials`
expands the grid into :class:`TrialConfig` objects, each with a stable
``trial_id`` derived from everything that affects training (which row is
the baseline does not: it changes the report, not what is trained).

Every problem with a study file is a :class:`StudyError` whose text is one
line, ``"<file>: <field path>: <problem>; allowed: <...>"``, e.g.::

    studies/x.yaml: scaling[2].scale: -1 is out of range; allowed: numbers > 0

This package must stay free of torch, Ray and MLflow: ``lsbench validate``
and ``lsbench run --dry-run`` use it and must be instant.

Modules: ``errors`` (:class:`StudyError`, value wording), ``fields`` (the
constrained field types), ``schema`` (the pydantic models), ``datasets`` (the ``dataset`` section's models), ``trial_config``
(:class:`TrialConfig`), ``methods`` (one entry per scaling method: options,
defaults, id tag, label, scaler), ``grid`` (expansion, trial ids, the dry-run
table), ``load`` (pydantic errors -> :class:`StudyError`, the grid limit), ``yaml_text`` (the
YAML, bounded).
"""

from __future__ import annotations

# besides __all__, the names the single module this package replaced offered stay importable from
# here: the registry's fixed names, the concrete models and the trial-id helpers (the plug-ins' names:
# :mod:`.plugins`)
from ..core.registry import (
    BACKEND_NAMES,  # noqa: F401
    DYNAMIC_STYLES,  # noqa: F401
    EVAL_METRICS,  # noqa: F401
    VOC_CLASSES,
)

try:
    from .datasets import DATASET_MODELS, COCODataset, DatasetSpec, SyntheticDataset, VOC0712Dataset, VOCDataset  # noqa: F401
    from .errors import StudyError
    from .grid import TRIAL_ID_VERSION, make_trial_id, trial_identity, trial_table  # noqa: F401
    from .load import load_study, load_study_text
    from .methods import ResourcesOverride, ScalingEntry, default_label  # noqa: F401
    from .schema import DivergenceSpec, EvalSpec, ModelOptions, Resources, Schedule, Study  # noqa: F401
    from .trial_config import TrialConfig
except ImportError as _exc:
    # The schema needs pydantic; the plain tables (``precisions``) do not. The bare GPU machine that
    # runs benchmarks/gpu_check.py has no pydantic, and precision/runtime.py reads the precision table.
    if _exc.name != "pydantic" and "pydantic" not in str(_exc):
        raise

__all__ = [
    "StudyError",
    "load_study",
    "load_study_text",
    "default_label",
    "trial_table",
    "Study",
    "TrialConfig",
    "ScalingEntry",
    "DatasetSpec",
    "Schedule",
    "EvalSpec",
    "Resources",
    "ModelOptions",
    "DivergenceSpec",
    "VOC_CLASSES",
    "TRIAL_ID_VERSION",
]
