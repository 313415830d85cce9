"""Configurations of a study's stored trials: which runs are seeds of one setting, and how settings differ.

A study's name is not a configuration: the file may change between runs
(another ``lr``, another data folder) while its trials stay in the store
under the same name. Pooling those as seeds of one cell would average two
settings and call the spread seed noise. So every trial run carries
``lsbench.config_id`` (:func:`.grid.config_id`: its trial id's identity
without the seed); runs logged before that tag existed get one derived from
their params (:func:`params_config_id`), which can only ever equal another
derived one.

Two levels, both read from a run's MLflow params (strings, as
:meth:`.trial_config.TrialConfig.flat_params` writes them):

* the *configuration* (``config_id``): what one table cell pools;
* the *study setting* (:func:`study_setting`): the part that is the same for
  every row of one version of the study file (dataset, schedule, eval, model
  options, divergence, loader, fingerprints): the report gives each its own
  tables. Paths are left out (the fingerprints stand for what is under them),
  so one study's trials logged from two machines are one setting.

:func:`differing_fields` and :func:`describe` word the difference
(``schedule.lr = 0.01``), for the report's headings and the message
``lsbench run`` prints when a study changed (:func:`change_note`).

Standard library only (schema layer): ``sweep`` and the report use it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

__all__ = [
    "CONFIG_TAG",
    "NOT_CONFIG_PARAMS",
    "PATH_PARAMS",
    "config_params",
    "params_config_id",
    "run_config_id",
    "study_setting",
    "setting_id",
    "differing_fields",
    "describe",
    "change_note",
]

CONFIG_TAG = "lsbench.config_id"
#: params that do not change a trial's result (or that vary between the seeds of one configuration)
NOT_CONFIG_PARAMS = ("study", "trial_id", "label", "row", "seed", "max_failures", "log_every")
#: params that are paths on one machine; their content is in ``fingerprint.*``
PATH_PARAMS = ("dataset.root", "model_options.backbone_weights")
#: params that vary between the rows of one study file (a scaling entry may override them)
_ROW_PARAMS = ("model", "batch_size", "precision")
_ROW_PREFIXES = ("scaling.", "resources.")
NOT_RECORDED = "(not recorded)"


def config_params(params: Mapping[str, str]) -> dict[str, str]:
    """A run's params that make its configuration (all but :data:`NOT_CONFIG_PARAMS`)."""
    return {k: str(v) for k, v in params.items() if k not in NOT_CONFIG_PARAMS}


def _hash(d: Mapping[str, str]) -> str:
    blob = json.dumps(dict(d), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def params_config_id(params: Mapping[str, str]) -> str:
    """A configuration id derived from params, for runs without ``lsbench.config_id`` (prefix ``p``)."""
    return "p" + _hash(config_params(params))


def run_config_id(tags: Mapping[str, str], params: Mapping[str, str]) -> str:
    """The run's ``lsbench.config_id`` tag, else one derived from its params."""
    return tags.get(CONFIG_TAG) or params_config_id(params)


def study_setting(params: Mapping[str, str]) -> dict[str, str]:
    """The study-level part of a run's configuration: no row params, no paths."""
    return {
        k: v
        for k, v in config_params(params).items()
        if k not in _ROW_PARAMS and not k.startswith(_ROW_PREFIXES) and k not in PATH_PARAMS
    }


def setting_id(params: Mapping[str, str]) -> str:
    return _hash(study_setting(params))


def differing_fields(groups: Iterable[Mapping[str, str]]) -> list[str]:
    """Keys whose value is not the same in every group (a key missing from one differs), sorted."""
    groups = list(groups)
    keys = sorted({k for g in groups for k in g})
    return [k for k in keys if len({g.get(k, NOT_RECORDED) for g in groups}) > 1]


def _short(value: str, limit: int = 40) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."


def describe(params: Mapping[str, str], fields: Iterable[str]) -> str:
    """``schedule.lr = 0.01, dataset.fingerprint = voc:3f2a...``: ``params``' values of ``fields``."""
    return ", ".join(f"{k} = {_short(str(params.get(k, NOT_RECORDED)))}" for k in fields)


def change_note(study_name: str, current: Iterable, existing: Mapping[str, tuple[Mapping, Mapping]]) -> str | None:
    """The line ``lsbench run`` prints when the store holds trials of an earlier version of the study.

    ``current``: the study's :class:`~.trial_config.TrialConfig` objects;
    ``existing``: ``trial_id -> (tags, params)`` of the stored trial runs.
    A stored run is of an earlier configuration when neither its trial id nor
    its configuration is in the current grid (a seed dropped from the grid is
    not a changed configuration). None when there is none.
    """
    current = list(current)
    ids = {c.trial_id for c in current}
    cur_params = [c.flat_params() for c in current]
    cur_configs = {c.config_id() for c in current} | {params_config_id(p) for p in cur_params}
    stale = [
        (tags, params)
        for tid, (tags, params) in existing.items()
        if tid not in ids and run_config_id(tags, params) not in cur_configs
    ]
    if not stale:
        return None
    fields = []
    for k in sorted(
        {k for _, p in stale for k in config_params(p)} | {k for p in cur_params for k in config_params(p)}
    ):
        old = {str(p.get(k, NOT_RECORDED)) for _, p in stale}
        new = {str(p.get(k, NOT_RECORDED)) for p in cur_params}
        if not old <= new:  # a value none of the current trials has
            fields.append(k)
    n, k = len(stale), len({run_config_id(t, p) for t, p in stale})
    what = (
        f"{n} trial{'s' if n != 1 else ''} of "
        + ("an earlier configuration" if k == 1 else f"{k} earlier configurations")
        + (" are" if n != 1 else " is")
    )
    differs = (
        f" (differs in {', '.join(fields[:6])}{', ...' if len(fields) > 6 else ''})"
        if fields
        else " (differs in what its trial ids cover beyond the params: a model or method version)"
    )
    return (
        f"study {study_name!r} changed since its earlier runs: {what} kept in the store and reported "
        f"separately{differs}"
    )
