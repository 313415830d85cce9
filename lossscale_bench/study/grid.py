"""The grid: expansion into trials, trial ids and the dry-run table.

Everything here works on plain dicts and on the study's attributes; it
imports no model of :mod:`.schema` (which calls :func:`expand`). What a
scaling method contributes (its id tag, its default label) comes from its
entry in :mod:`.methods`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any

from ..core import plugins as registry
from .fingerprint import canonical_json, trial_fingerprint
from .methods import default_label, scaling_tag

__all__ = [
    "DALI_DATASETS",
    "TRIAL_ID_VERSION",
    "config_id",
    "default_batched_loss",
    "default_loader",
    "expand",
    "make_trial_id",
    "trial_identity",
    "trial_table",
]

#: bump when the trial_id recipe changes on purpose (it is part of the hash). Still 1 after the
#: fingerprints came in (see :func:`trial_identity`): a trial that reads no file has the identity it had,
#: and one that does reads a new key (``fingerprint``), so its id changed without a bump.
TRIAL_ID_VERSION = 1

_SAFE_ID_RE = re.compile(r"[^A-Za-z0-9_.-]+")


# --------------------------------------------------------------------------- trial ids


def _identity_dataset(dataset) -> dict:
    """The dataset's part of a trial's identity: every option but ``root`` and ``bad_annotations``."""
    # bad_annotations changes no result that exists: on clean data both policies train the same,
    # and on data with a bad annotation `error` gives no result at all (a user error)
    ds = {k: v for k, v in dataset.items() if k not in ("root", "bad_annotations")}
    if ds.get("train_max_side") is None:  # photos as stored: the ids trials had before the option existed
        ds.pop("train_max_side", None)
    return ds


def _identity_resources(resources) -> dict:
    """The resources' part of a trial's identity: backend, devices, the CPU thread count, ``repeatable``."""
    return {
        "backend": resources.get("backend"),
        "devices_per_trial": resources.get("devices_per_trial"),
        **(
            {"cpu_threads": max(1, int(float(resources.get("cpus_per_trial") or 1)))}
            if resources.get("backend") == "cpu"
            else {}
        ),
        # kernels pinned at AVX2 (study/resources.py says why this is in); absent when off
        **({"repeatable": True} if resources.get("repeatable") else {}),
    }


def trial_identity(
    model,
    batch_size,
    precision,
    scaling,
    seed,
    dataset,
    schedule,
    eval_,
    resources,
    model_options,
    divergence,
    loader,
    fingerprint=None,
    on_divergence="stop",
    seed_streams=None,
    plugins=None,
) -> dict:
    """Everything that changes a trial's result, and no machine-specific path.

    Content, not paths (:mod:`.fingerprint` says why): the dataset root and the
    backbone weights' path are left out, and ``fingerprint`` (from
    :func:`.fingerprint.trial_fingerprint`: the data's and the weights' content
    fingerprints) goes in, so the same data gives the same ids on every machine
    and other data under the same path gives other ids. Every option of
    ``dataset`` (but ``root``), ``schedule``, ``eval``, ``model_options``,
    ``divergence`` and the loader is in, whole. ``cpus_per_trial`` is in on the
    CPU backend: a trial's torch thread count is set from it, and the order of
    floating-point reductions, so the numbers, follows the thread count (30
    steps of ssd_tiny at 1 and 2 threads ended 0.6 apart in loss).
    ``resources.repeatable: true`` is in (other kernels on an AVX-512 machine,
    study/resources.py); absent or false adds nothing.
    ``on_divergence: continue`` is in (a diverged trial then trains on to a
    final mAP instead of stopping without one); ``stop``, the default, adds
    nothing, so ids of the default stay as they were. Models and scaling
    methods whose code changed what they train to carry a version
    (their registry entry's ``version``). A plug-in from outside the package
    (``plugins``: kind -> its :meth:`~lossscale_bench.core.plugins.Plugin.identity`,
    its origin and the digest of its source) is in, so an edited plug-in never
    reuses old results; the package's own add nothing. Label, description,
    row, ``baseline``, ``log_every`` and ``max_failures`` change neither what
    is trained nor how it is scored.

    ``TRIAL_ID_VERSION`` was not bumped for the fingerprints: keys are added
    only where there is something to add (a trial reading no file, with the
    default ``on_divergence``, hashes exactly what it did), so finished
    synthetic-data results stay reusable while every trial that reads files
    got a new id (its old one did not cover what it read).
    """
    ds = _identity_dataset(dataset)
    mo = dict(model_options)
    if mo.get("backbone_weights"):
        mo["backbone_weights"] = True  # which file: fingerprint["weights"], by content
    model_version = _version("model", model)
    method_version = _version("method", scaling.get("method"))
    return {
        "v": TRIAL_ID_VERSION,
        "model": model,
        "batch_size": batch_size,
        "precision": precision,
        "scaling": dict(scaling),
        "seed": seed,
        "dataset": ds,
        "schedule": dict(schedule),
        "eval": dict(eval_),
        "resources": _identity_resources(resources),
        "model_options": mo,
        "divergence": dict(divergence),
        "loader": loader,
        # only models that changed carry a version, so other models' ids stay as they were
        **({"model_version": model_version} if model_version is not None else {}),
        **({"method_version": method_version} if method_version is not None else {}),
        **({"plugins": dict(plugins)} if plugins else {}),
        **({"fingerprint": dict(fingerprint)} if fingerprint else {}),
        **({"on_divergence": on_divergence} if on_divergence not in (None, "stop") else {}),
        # streams that do not follow the seed as they always did (schema.SeedStreams); none by default
        **({"seed_streams": dict(seed_streams)} if seed_streams else {}),
    }


def _version(kind: str, name) -> int | None:
    """The registered version of a model or method (None: never bumped, or not registered by name)."""
    if not isinstance(name, str) or name not in registry.names(kind):
        return None
    try:
        return registry.entry(kind, name).version
    except registry.PluginError:
        return None


def trial_plugins(study, model: str, scaling: dict, precision: str, dataset: dict) -> dict:
    """kind -> identity of each plug-in from outside the package a trial uses (empty for built-ins)."""
    used = {
        "model": study.model_plugin(model),
        "method": registry.entry("method", scaling.get("method")),
        "precision": registry.entry("precision", precision),
        "dataset": study.dataset_plugin(),
    }
    return {k: {"name": p.name, **p.identity()} for k, p in used.items() if not p.built_in}


def config_id(identity: dict) -> str:
    """The configuration a trial is a seed of: the hash of its identity without the seed.

    The report pools seeds into one cell only when this is equal (tag
    ``lsbench.config_id``), so two configurations stored under one study
    name (a study file changed, same row) are never averaged together.
    """
    rest = {k: v for k, v in identity.items() if k != "seed"}
    return hashlib.sha256(canonical_json(rest).encode()).hexdigest()[:12]


def make_trial_id(identity: dict) -> str:
    """The trial id of ``identity``: a readable prefix (model, batch size, precision, method,
    seed) and the first 8 hex digits of the SHA-256 of its canonical JSON."""
    digest = hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:8]
    readable = "-".join(
        [
            identity["model"],
            f"bs{identity['batch_size']}",
            identity["precision"],
            scaling_tag(identity["scaling"]),
            f"s{identity['seed']}",
        ]
    )
    readable = _SAFE_ID_RE.sub("_", readable)
    return f"{readable}-{digest}"


# --------------------------------------------------------------------------- expansion


#: data sets whose per-image records the DALI loader reads (data/dali.py ``sample_info``)
DALI_DATASETS = ("synthetic", "voc", "coco2017")


def default_loader(backend: str | None, dataset: dict) -> str:
    """The loader of a study that names none: DALI's GPU pipeline (nvJPEG decode, prefetch) for
    ``backend: cuda`` where ``nvidia.dali`` is importable here and the data set is one DALI reads
    (not ``fake_data``), else torch's DataLoader. Resolved when the grid is expanded, so the trial id
    (which has the loader: decoders differ in the last bit of a pixel) says which one ran; a CPU
    study's ids stay as they were."""
    if backend != "cuda" or dataset.get("name") not in DALI_DATASETS or dataset.get("fake_data"):
        return "torch"
    import importlib.util

    try:
        found = importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):  # no ``nvidia`` namespace package at all
        found = False
    return "dali" if found else "torch"


def default_batched_loss(backend: str | None) -> bool:
    """The multibox loss of a study that does not choose: batched on accelerators, torchvision's
    per-image loop on the CPU backend.

    Why not batched everywhere: the two agree within float tolerance, not bit for bit, and a few
    hundred steps of training amplify last-bit differences to the size of seed noise (docs/development/toy-model.md),
    so the loss implementation is part of a trial's identity. Keeping torchvision's loss on the CPU,
    where it costs at most ~10 % of an ssd_tiny step (docs/records/index.md "Batched loss"), keeps
    every CPU result measured before the batched loss existed (the README's demo table, the
    methods_fp8 study) valid under its old trial id. On a GPU, where the per-image loop's host
    syncs cost most, no such results exist yet, so the faster loss is the default there.
    """
    return backend not in (None, "cpu")


def _resolved_model_options(model_options: dict, backend: str | None, takes_batched: bool = True) -> dict:
    """``model_options`` with ``batched_loss`` resolved: ``True`` is written (it enters the id),
    torchvision's loss is the absence of the key, so CPU trials keep the ids they always had. A
    model without the option (not an SSD of the package's) gets only what the study gives."""
    mo = dict(model_options)
    if not takes_batched:
        return mo
    batched = mo.pop("batched_loss", None)
    if batched if batched is not None else default_batched_loss(backend):
        mo["batched_loss"] = True
    return mo


def _study_sections(study) -> tuple[dict, dict, dict, dict, dict, dict, dict]:
    """The study's sections every trial shares, as plain dicts: ``(dataset, schedule, eval, resources,
    model_options, divergence, fingerprint)``."""
    dataset = study.dataset.model_dump(mode="json")
    schedule = study.schedule.model_dump(mode="json")
    eval_ = study.eval.model_dump(mode="json")
    # an option left out is not carried (a trial's params stay what they were before it existed)
    resources = {
        k: v for k, v in study.resources.model_dump(mode="json").items() if v is not None or k not in ("repeatable",)
    }
    # only the options given: they are passed on as keyword arguments of the model builder
    model_options = study.model_options.model_dump(mode="json", exclude_none=True)
    divergence = study.divergence.model_dump(mode="json")
    # once per study: a VOC fingerprint stats every listed file, a weights file is hashed
    fingerprint = trial_fingerprint(dataset, model_options)
    return dataset, schedule, eval_, resources, model_options, divergence, fingerprint


def expand(study) -> list[dict[str, Any]]:
    """A validated study's grid as :class:`~.trial_config.TrialConfig` keyword arguments, in order.

    model × batch_size × scaling entry × seed, overrides applied; a point whose
    trial id an earlier point already has is dropped (a ``baseline: true`` on it
    moves to that earlier trial: it is the same training run).
    """
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}  # trial_id -> index in out
    dataset, schedule, eval_, resources, model_options, divergence, fingerprint = _study_sections(study)
    for model in study.model:
        for bs in study.batch_size:
            for row, entry in enumerate(study.scaling):
                ov = entry.overrides()
                m = ov.get("model", model)
                b = ov.get("batch_size", bs)
                p = ov.get("precision", study.precision)
                scaling = entry.normalized()
                label = entry.label if entry.label is not None else default_label(scaling, p)
                res = {**resources, **(entry.resources.given() if entry.resources is not None else {})}
                loader = (
                    study.loader if "loader" in study.model_fields_set else default_loader(res.get("backend"), dataset)
                )
                takes_batched = study.model_plugin(m).option("batched_loss") is not None
                mo, used = (
                    _resolved_model_options(model_options, res.get("backend"), takes_batched),
                    trial_plugins(study, m, scaling, p, dataset),
                )
                for seed in study.seeds:
                    streams = study.seed_streams.given()
                    ident = trial_identity(*(m, b, p, scaling, seed, dataset, schedule, eval_, res, mo), divergence,
                                           loader, fingerprint, study.on_divergence, streams, used)  # fmt: skip
                    tid = make_trial_id(ident)
                    if tid in seen:
                        if entry.baseline:
                            out[seen[tid]]["baseline"] = True
                        continue
                    seen[tid] = len(out)
                    out.append(
                        dict(
                            study=study.name,
                            trial_id=tid,
                            model=m,
                            batch_size=b,
                            precision=p,
                            scaling=dict(scaling),
                            label=label,
                            row=row,
                            seed=seed,
                            baseline=entry.baseline,
                            plugins=used,
                            plugin_dir=study.plugin_dir() if used else None,
                            dataset=dict(dataset),
                            schedule=dict(schedule),
                            eval=dict(eval_),
                            resources=dict(res),
                            model_options=mo,
                            divergence=dict(divergence),
                            on_divergence=study.on_divergence,
                            max_failures=study.max_failures,
                            log_every=study.log_every,
                            loader=loader,
                            fingerprint=dict(fingerprint),
                            seed_streams=streams,
                        )
                    )
    return out


# --------------------------------------------------------------------------- labels and tables


def trial_table(trials: Iterable, placement: Callable[[dict], str]) -> list[dict]:
    """Rows for ``lsbench run --dry-run``, in trial order.

    ``placement(resources) -> str`` fills the ``resources`` column (what Ray
    reserves; ``lossscale_bench.placement.placement_text``). The study layer does
    not import the orchestration layer: the caller passes it.
    """
    return [
        {
            "trial_id": t.trial_id,
            "model": t.model,
            "batch_size": t.batch_size,
            "precision": t.precision,
            "label": t.label,
            "seed": t.seed,
            "backend": t.resources.get("backend", "cpu"),
            "resources": placement(t.resources),
        }
        for t in trials
    ]
