"""One trial: :class:`TrialConfig`, a fully resolved, JSON-able point of a study's grid.

It is what a trial runs from (``lossscale_bench.trial``) and what Ray ships to a
worker, so it holds plain dicts, not the study's section models.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from .grid import config_id, trial_identity


class TrialConfig(BaseModel):
    """One trial: a fully resolved, JSON-able point of the study grid."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    study: str
    trial_id: str
    model: str
    batch_size: int
    precision: str
    scaling: dict[str, Any]
    label: str
    row: int
    seed: int
    #: the study's ``baseline: true`` entry; a report setting (tag ``lsbench.baseline``), not in the id
    baseline: bool = False
    dataset: dict[str, Any]
    schedule: dict[str, Any]
    eval: dict[str, Any]
    resources: dict[str, Any]
    model_options: dict[str, Any]
    divergence: dict[str, Any]
    on_divergence: str = "stop"
    max_failures: int = 2
    log_every: int = 10
    loader: str = "torch"
    #: content fingerprints of the files the trial reads (:func:`.fingerprint.trial_fingerprint`);
    #: computed once per study at expansion, part of the id; empty when it reads none
    fingerprint: dict[str, str] = {}
    #: random streams set otherwise than the default (``{"init": 0}``, ``{"val": "trial"}``:
    #: schema.SeedStreams); empty by default, and then not in the id
    seed_streams: dict[str, int | str] = {}
    #: kind -> name, origin and source digest of each plug-in from outside the package the trial uses
    #: (:func:`.grid.trial_plugins`); part of the id; empty (and then not in the id) for built-ins
    plugins: dict[str, dict[str, Any]] = {}
    #: the study file's folder, put first on ``sys.path`` where the trial builds an import-path plug-in;
    #: a machine path, so not in the id
    plugin_dir: str | None = None

    def __hash__(self) -> int:  # dict fields are unhashable; the id identifies the trial
        return hash((self.study, self.trial_id))

    def to_dict(self) -> dict:
        return json.loads(json.dumps(self.model_dump(mode="json")))

    @classmethod
    def from_dict(cls, d: dict) -> TrialConfig:
        return cls.model_validate(d)

    def identity(self) -> dict:
        """What the trial_id hashes (see :func:`.grid.trial_identity`)."""
        return trial_identity(
            self.model,
            self.batch_size,
            self.precision,
            self.scaling,
            self.seed,
            self.dataset,
            self.schedule,
            self.eval,
            self.resources,
            self.model_options,
            self.divergence,
            self.loader,
            self.fingerprint,
            self.on_divergence,
            self.seed_streams,
            self.plugins,
        )

    def stream_seed(self, stream: str) -> int | None:
        """The seed of a random stream (``init``, ``data``, ``val``) for this trial: the trial's seed,
        a fixed one (schema.SeedStreams), or None for ``val`` when the dataset's own set is used."""
        v = self.seed_streams.get(stream, None if stream == "val" else "trial")
        return None if v is None else self.seed if v == "trial" else int(v)

    def plugin_tags(self) -> dict[str, str]:
        """MLflow tags naming each plug-in from outside the package: name, origin, digest."""
        out = {}
        for kind, p in sorted(self.plugins.items()):
            out.update(
                {
                    f"lsbench.plugin.{kind}.name": str(p.get("name")),
                    f"lsbench.plugin.{kind}.origin": str(p.get("origin")),
                    f"lsbench.plugin.{kind}.digest": str(p.get("digest")),
                }
            )
        return out

    def config_id(self) -> str:
        """The configuration this trial is a seed of (tag ``lsbench.config_id``; :func:`.grid.config_id`)."""
        return config_id(self.identity())

    def flat_params(self) -> dict[str, str]:
        """Dotted keys for MLflow params; every value a string of at most 500 characters.

        Scalars print as in YAML/JSON (``true``, ``null``, ``0.001``); lists as JSON.
        ``baseline`` is not a param: MLflow params cannot change once logged, and
        which row is the baseline may change after the trial ran (it is a tag).
        """
        out: dict[str, str] = {}
        for k in (
            "study",
            "trial_id",
            "model",
            "batch_size",
            "precision",
            "label",
            "row",
            "seed",
            "on_divergence",
            "max_failures",
            "log_every",
            "loader",
        ):
            out[k] = _param_str(getattr(self, k))
        for section in (
            "scaling",
            "dataset",
            "schedule",
            "eval",
            "resources",
            "model_options",
            "divergence",
            "fingerprint",
        ):
            for k, v in getattr(self, section).items():
                out[f"{section}.{k}"] = _param_str(v)
        return out


def _param_str(v: Any) -> str:
    if isinstance(v, str):
        s = v
    elif v is None or isinstance(v, (bool, list, dict, tuple)):
        s = json.dumps(v)
    else:
        s = str(v)
    return s if len(s) <= 500 else s[:497] + "..."
