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

This module must stay free of torch, Ray and MLflow: ``lsbench validate``
and ``lsbench run --dry-run`` use it and must be instant.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .registry import (
    BACKEND_NAMES,
    DATASET_NAMES,
    DYNAMIC_STYLES,
    EVAL_METRICS,
    MODEL_NAMES,
    MODEL_VERSIONS,
    PRECISIONS,
    SCALING_METHODS,
)

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

#: bump when the trial_id recipe changes on purpose (it is part of the hash)
TRIAL_ID_VERSION = 1

VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
    "train", "tvmonitor",
)

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_SAFE_ID_RE = re.compile(r"[^A-Za-z0-9_.-]+")
_DEFAULT_SOURCE = "<string>"


# --------------------------------------------------------------------------- errors


class StudyError(Exception):
    """A problem with a study file; ``str(e)`` is one line.

    Attributes: ``file``, ``path`` (field path such as ``scaling[2].scale``,
    or ``line 3, column 5`` for YAML syntax, or ``""``), ``problem`` and
    ``allowed`` (``None`` when there is no set or range to name).
    """

    def __init__(self, file: str, path: str, problem: str, allowed: str | None = None) -> None:
        self.file = str(file)
        self.path = path
        self.problem = _one_line(problem)
        self.allowed = _one_line(allowed) if allowed else None
        parts = [self.file]
        if path:
            parts.append(path)
        parts.append(self.problem)
        msg = ": ".join(parts)
        if self.allowed:
            msg += f"; allowed: {self.allowed}"
        super().__init__(msg)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _show(v: Any) -> str:
    """A value as the user wrote it (YAML-ish), short."""
    if v is None:
        s = "null"
    elif isinstance(v, bool):
        s = "true" if v else "false"
    elif isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        s = str(int(v))
    elif isinstance(v, (int, float)):
        s = repr(v)
    else:
        s = repr(v)
    s = _one_line(s)
    return s if len(s) <= 80 else s[:77] + "..."


def _fmt_num(x: float | int) -> str:
    """128.0 -> '128', 0.5 -> '0.5'."""
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return repr(x) if isinstance(x, float) else str(x)


def _suggest(word: Any, names) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [str(n) for n in names], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _err(problem: str, allowed: str | None = None) -> PydanticCustomError:
    ctx = {"problem": problem}
    if allowed:
        ctx["allowed"] = allowed
    return PydanticCustomError("lsbench", "{problem}", ctx)


def _ctx_source(info: ValidationInfo | None) -> str:
    ctx = getattr(info, "context", None) or {}
    return str(ctx.get("source", _DEFAULT_SOURCE))


def _ctx_base_dir(info: ValidationInfo | None) -> str:
    ctx = getattr(info, "context", None) or {}
    return str(ctx.get("base_dir") or os.getcwd())


def _resolve_path(p: str, base_dir: str) -> str:
    p = os.path.expanduser(p)
    if not os.path.isabs(p):
        p = os.path.join(base_dir, p)
    return os.path.normpath(p)


# --------------------------------------------------------------------------- field types
# Custom before-validators give uniform one-line messages with an 'allowed'
# part; pydantic's own messages are never shown to the user.


def _range_text(kind: str, gt=None, ge=None, lt=None, le=None, nullable=False) -> str:
    noun = "integers" if kind == "int" else "numbers"
    lo = f"{_fmt_num(gt)} < " if gt is not None else (f"{_fmt_num(ge)} <= " if ge is not None else "")
    hi = f" < {_fmt_num(lt)}" if lt is not None else (f" <= {_fmt_num(le)}" if le is not None else "")
    if lo and hi:
        text = f"{noun} {lo}x{hi}"
    elif lo:
        op = lo.split()[1]
        text = f"{noun} {'>' if op == '<' else '>='} {lo.split()[0]}"
    elif hi:
        text = f"{noun}{hi}"
    else:
        text = noun
    return text + (" or null" if nullable else "")


def _number(kind: str, *, gt=None, ge=None, lt=None, le=None, nullable: bool = False):
    allowed = _range_text(kind, gt, ge, lt, le, nullable)
    expected = "an integer" if kind == "int" else "a number"

    def check(v: Any):
        if v is None:
            if nullable:
                return None
            raise _err(f"expected {expected}, got null", allowed)
        orig = v
        if isinstance(v, bool):
            raise _err(f"expected {expected}, got {_show(v)}", allowed)
        if isinstance(v, str):  # YAML reads 1e-3 (no dot) as a string
            try:
                v = float(v.strip())
            except ValueError:
                raise _err(f"expected {expected}, got {_show(orig)}", allowed) from None
        if not isinstance(v, (int, float)):
            raise _err(f"expected {expected}, got {_show(orig)}", allowed)
        if isinstance(v, float) and not math.isfinite(v):
            raise _err(f"expected a finite number, got {_show(orig)}", allowed)
        if kind == "int":
            if isinstance(v, float):
                if not v.is_integer():
                    raise _err(f"expected an integer, got {_show(orig)}", allowed)
                v = int(v)
        else:
            v = float(v)
        if (gt is not None and not v > gt) or (ge is not None and not v >= ge) \
                or (lt is not None and not v < lt) or (le is not None and not v <= le):
            raise _err(f"{_show(orig)} is out of range", allowed)
        return v

    base = int if kind == "int" else float
    return Annotated[Optional[base] if nullable else base, BeforeValidator(check)]


def _choice(kind: str, names):
    names = tuple(names)

    def check(v: Any):
        if isinstance(v, str) and v in names:
            return v
        raise _err(f"unknown {kind} {_show(v)}{_suggest(v, names)}", ", ".join(names))

    return Annotated[str, BeforeValidator(check)]


def _check_bool(v: Any):
    if isinstance(v, bool):
        return v
    raise _err(f"expected true or false, got {_show(v)}", "true, false")


def _string(*, coerce_numbers: bool = False, nullable: bool = False):
    def check(v: Any):
        if v is None and nullable:
            return None
        if coerce_numbers and isinstance(v, (int, float)) and not isinstance(v, bool):
            v = _fmt_num(v)
        if not isinstance(v, str):
            raise _err(f"expected a string, got {_show(v)}")
        if not v.strip():
            raise _err("must not be empty")
        return v

    return Annotated[Optional[str] if nullable else str, BeforeValidator(check)]


def _as_list(v: Any, *, empty_ok: bool = False):
    """A scalar where a list is expected becomes a one-element list."""
    if v is None or (isinstance(v, list) and not v):
        if empty_ok:
            return []
        raise _err("must not be empty")
    if isinstance(v, (str, int, float, bool)):
        return [v]
    if isinstance(v, tuple):
        return list(v)
    return v


def _mapping_or_empty(v: Any):
    """Optional sections: ``eval:`` with nothing after it means defaults."""
    return {} if v is None else v


Bool = Annotated[bool, BeforeValidator(_check_bool)]
Str = _string()
OptStr = _string(nullable=True)
PosInt = _number("int", ge=1)
NonNegInt = _number("int", ge=0)
PosFloat = _number("float", gt=0)

_STRICT = ConfigDict(extra="forbid", frozen=True, validate_default=False)


# --------------------------------------------------------------------------- scaling entries


class ResourcesOverride(BaseModel):
    """A scaling entry's own resources (a study may mix backends: GPU rows next to Gaudi rows)."""

    model_config = _STRICT

    backend: Optional[_choice("backend", BACKEND_NAMES)] = None  # type: ignore[valid-type]
    devices_per_trial: Optional[PosInt] = None  # type: ignore[valid-type]
    cpus_per_trial: Optional[PosFloat] = None  # type: ignore[valid-type]

    def given(self) -> dict:
        return {k: v for k, v in self.model_dump(mode="json").items() if v is not None}


class _ScalingBase(BaseModel):
    model_config = _STRICT

    label: _string(coerce_numbers=True, nullable=True) = None  # type: ignore[valid-type]
    precision: Optional[_choice("precision", PRECISIONS)] = None  # type: ignore[valid-type]
    model: Optional[_choice("model", MODEL_NAMES)] = None  # type: ignore[valid-type]
    batch_size: Optional[PosInt] = None  # type: ignore[valid-type]
    resources: Optional[ResourcesOverride] = None
    #: the report's reference row (Welch's t-test of every other row against it); not in the trial id
    baseline: Bool = False  # type: ignore[valid-type]

    def normalized(self) -> dict:
        """``{"method": ..., every option with defaults filled}``; no label, no overrides."""
        out = {"method": self.method}  # type: ignore[attr-defined]
        for k in type(self).model_fields:
            if k not in _COMMON_KEYS:
                out[k] = getattr(self, k)
        return out

    def overrides(self) -> dict:
        return {k: getattr(self, k) for k in ("precision", "model", "batch_size") if getattr(self, k) is not None}


class NoneScaling(_ScalingBase):
    method: Literal["none"]


class FixedScaling(_ScalingBase):
    method: Literal["fixed"]
    scale: PosFloat = 1.0  # type: ignore[valid-type]
    skip_nonfinite: Bool = True  # type: ignore[valid-type]


_DYNAMIC_DEFAULTS = {"chainer": {"interval": 10, "init_scale": 1.0},
                     "torch": {"interval": 2000, "init_scale": 65536.0}}


class DynamicScaling(_ScalingBase):
    method: Literal["dynamic"]
    style: _choice("dynamic style", DYNAMIC_STYLES) = "chainer"  # type: ignore[valid-type]
    interval: Optional[PosInt] = None  # type: ignore[valid-type]
    init_scale: Optional[PosFloat] = None  # type: ignore[valid-type]

    def normalized(self) -> dict:
        d = _DYNAMIC_DEFAULTS[self.style]
        return {
            "method": "dynamic",
            "style": self.style,
            "interval": self.interval if self.interval is not None else d["interval"],
            "init_scale": self.init_scale if self.init_scale is not None else d["init_scale"],
        }


class AdaptiveScaling(_ScalingBase):
    method: Literal["adaptive"]
    update_every: PosInt = 1  # type: ignore[valid-type]
    n_uf_threshold: _number("float", gt=0, lt=1) = 1e-3  # type: ignore[valid-type]
    scale_upper_bound: PosFloat = 16.0  # type: ignore[valid-type]
    accum_upper_bound: PosFloat = 1024.0  # type: ignore[valid-type]
    power_of_two: Bool = True  # type: ignore[valid-type]
    init_scale: PosFloat = 1.0  # type: ignore[valid-type]


_COMMON_KEYS = ("method", "label", "precision", "model", "batch_size", "resources", "baseline")
SCALING_MODELS: dict[str, type[_ScalingBase]] = {
    "none": NoneScaling, "fixed": FixedScaling, "dynamic": DynamicScaling, "adaptive": AdaptiveScaling,
}
assert tuple(SCALING_MODELS) == tuple(SCALING_METHODS)

ScalingEntry = Annotated[
    Union[NoneScaling, FixedScaling, DynamicScaling, AdaptiveScaling],
    Discriminator("method"),
]


def _scaling_keys(method: str) -> list[str]:
    fields = list(SCALING_MODELS[method].model_fields)
    return list(_COMMON_KEYS) + [k for k in fields if k not in _COMMON_KEYS]


# --------------------------------------------------------------------------- dataset


class _DatasetBase(BaseModel):
    model_config = _STRICT

    @field_validator("root", mode="after", check_fields=False)
    @classmethod
    def _root_abs(cls, v, info: ValidationInfo):
        return None if v is None else _resolve_path(v, _ctx_base_dir(info))

    @model_validator(mode="after")
    def _unique_classes(self, info: ValidationInfo):
        seen: dict[str, int] = {}
        for i, c in enumerate(getattr(self, "classes", None) or ()):
            if c in seen:
                raise StudyError(_ctx_source(info), f"dataset.classes[{i}]",
                                 f"duplicate class {c!r} (also at index {seen[c]})")
            seen[c] = i
        return self


class SyntheticDataset(_DatasetBase):
    name: Literal["synthetic"]
    root: OptStr = None  # type: ignore[valid-type]
    train_images: PosInt = 512  # type: ignore[valid-type]
    val_images: PosInt = 128  # type: ignore[valid-type]
    image_size: _number("int", ge=32) = 128  # type: ignore[valid-type]
    seed: NonNegInt = 0  # type: ignore[valid-type]


Classes = Annotated[list[Str], BeforeValidator(lambda v: _as_list(v))]  # type: ignore[valid-type]


class VOCDataset(_DatasetBase):
    name: Literal["voc"]
    root: Str  # type: ignore[valid-type]
    classes: Classes
    train_split: Str = "trainval"  # type: ignore[valid-type]
    val_split: Str = "test"  # type: ignore[valid-type]


class VOC0712Dataset(_DatasetBase):
    name: Literal["voc0712"]
    root: Str  # type: ignore[valid-type]
    classes: Classes = Field(default_factory=lambda: list(VOC_CLASSES))
    train_split: Str = "trainval"  # type: ignore[valid-type]
    val_split: Str = "test"  # type: ignore[valid-type]


class COCODataset(_DatasetBase):
    name: Literal["coco2017"]
    root: OptStr = None  # type: ignore[valid-type]
    fake_data: Bool = False  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _root_needed(self, info: ValidationInfo):
        if self.root is None and not self.fake_data:
            raise StudyError(_ctx_source(info), "dataset.root", "required unless fake_data: true")
        return self


DATASET_MODELS: dict[str, type[_DatasetBase]] = {
    "synthetic": SyntheticDataset, "voc": VOCDataset, "voc0712": VOC0712Dataset, "coco2017": COCODataset,
}
assert tuple(DATASET_MODELS) == tuple(DATASET_NAMES)

DatasetSpec = Annotated[
    Union[SyntheticDataset, VOCDataset, VOC0712Dataset, COCODataset],
    Discriminator("name"),
]


# --------------------------------------------------------------------------- other sections


def _lr_steps(v: Any):
    return _as_list(v, empty_ok=True)


class Schedule(BaseModel):
    model_config = _STRICT

    iterations: PosInt  # type: ignore[valid-type]
    lr: PosFloat  # type: ignore[valid-type]
    warmup_iterations: NonNegInt = 0  # type: ignore[valid-type]
    warmup_factor: _number("float", gt=0, le=1) = 0.1  # type: ignore[valid-type]
    lr_steps: Annotated[list[PosInt], BeforeValidator(_lr_steps)] = Field(default_factory=list)  # type: ignore[valid-type]
    lr_gamma: PosFloat = 0.1  # type: ignore[valid-type]
    momentum: _number("float", ge=0, lt=1) = 0.9  # type: ignore[valid-type]
    weight_decay: _number("float", ge=0) = 5e-4  # type: ignore[valid-type]
    grad_clip: _number("float", gt=0, nullable=True) = None  # type: ignore[valid-type]
    bias_grad_factor: PosFloat = 1.0  # type: ignore[valid-type]


class EvalSpec(BaseModel):
    model_config = _STRICT

    every: _number("int", ge=1, nullable=True) = None  # type: ignore[valid-type]
    metric: _choice("eval metric", EVAL_METRICS) = "coco"  # type: ignore[valid-type]
    max_images: _number("int", ge=1, nullable=True) = None  # type: ignore[valid-type]


class Resources(BaseModel):
    model_config = _STRICT

    backend: _choice("backend", BACKEND_NAMES) = "cpu"  # type: ignore[valid-type]
    devices_per_trial: PosInt = 1  # type: ignore[valid-type]
    cpus_per_trial: PosFloat = 1.0  # type: ignore[valid-type]


class ModelOptions(BaseModel):
    model_config = _STRICT

    image_size: _number("int", ge=32, nullable=True) = None  # type: ignore[valid-type]
    width: _number("int", ge=4, nullable=True) = None  # type: ignore[valid-type]
    #: ssd_tiny only: BatchNorm after each backbone conv (the model's default: true)
    batch_norm: Optional[Bool] = None  # type: ignore[valid-type]
    backbone_weights: OptStr = None  # type: ignore[valid-type]

    @field_validator("backbone_weights", mode="after")
    @classmethod
    def _weights_abs(cls, v, info: ValidationInfo):
        return None if v is None else _resolve_path(v, _ctx_base_dir(info))


class DivergenceSpec(BaseModel):
    model_config = _STRICT

    patience: PosInt = 10  # type: ignore[valid-type]
    max_consecutive_skips: PosInt = 200  # type: ignore[valid-type]


_SECTION_MODELS: dict[str, type[BaseModel]] = {
    "schedule": Schedule, "eval": EvalSpec, "resources": Resources,
    "model_options": ModelOptions, "divergence": DivergenceSpec,
}


# --------------------------------------------------------------------------- trial config


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

    def __hash__(self) -> int:  # dict fields are unhashable; the id identifies the trial
        return hash((self.study, self.trial_id))

    def to_dict(self) -> dict:
        return json.loads(json.dumps(self.model_dump(mode="json")))

    @classmethod
    def from_dict(cls, d: dict) -> "TrialConfig":
        return cls.model_validate(d)

    def identity(self) -> dict:
        """What the trial_id hashes (see :func:`_identity`)."""
        return _identity(self.model, self.batch_size, self.precision, self.scaling, self.seed,
                         self.dataset, self.schedule, self.eval, self.resources, self.model_options,
                         self.divergence, self.loader)

    def flat_params(self) -> dict[str, str]:
        """Dotted keys for MLflow params; every value a string of at most 500 characters.

        Scalars print as in YAML/JSON (``true``, ``null``, ``0.001``); lists as JSON.
        ``baseline`` is not a param: MLflow params cannot change once logged, and
        which row is the baseline may change after the trial ran (it is a tag).
        """
        out: dict[str, str] = {}
        for k in ("study", "trial_id", "model", "batch_size", "precision", "label", "row", "seed",
                  "on_divergence", "max_failures", "log_every", "loader"):
            out[k] = _param_str(getattr(self, k))
        for section in ("scaling", "dataset", "schedule", "eval", "resources", "model_options", "divergence"):
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


def _identity(model, batch_size, precision, scaling, seed, dataset, schedule, eval_, resources,
              model_options, divergence, loader) -> dict:
    """Everything that affects training, minus machine-specific paths.

    Dataset roots and the backbone weights' directory are left out so that the
    same study gives the same ids on every machine (the weights' file name
    stays in). Label, description, row, log_every, max_failures and
    on_divergence do not change what is trained. ``cpus_per_trial`` does on
    the CPU backend: a trial's torch thread count is set from it, and the
    order of floating-point reductions, so the numbers, follows the thread
    count (30 steps of ssd_tiny at 1 and 2 threads ended 0.6 apart in loss).
    """
    ds = {k: v for k, v in dataset.items() if k != "root"}
    mo = dict(model_options)
    if mo.get("backbone_weights"):
        mo["backbone_weights"] = os.path.basename(str(mo["backbone_weights"]))
    return {
        "v": TRIAL_ID_VERSION,
        "model": model, "batch_size": batch_size, "precision": precision, "scaling": dict(scaling),
        "seed": seed, "dataset": ds, "schedule": dict(schedule), "eval": dict(eval_),
        "resources": {"backend": resources.get("backend"), "devices_per_trial": resources.get("devices_per_trial"),
                      **({"cpu_threads": max(1, int(float(resources.get("cpus_per_trial") or 1)))}
                         if resources.get("backend") == "cpu" else {})},
        "model_options": mo, "divergence": dict(divergence), "loader": loader,
        # only models that changed carry a version, so other models' ids stay as they were
        **({"model_version": MODEL_VERSIONS[model]} if model in MODEL_VERSIONS else {}),
    }


def _scaling_tag(s: dict) -> str:
    m = s.get("method")
    if m == "fixed":
        return f"fixed{_fmt_num(s.get('scale', 1.0))}"
    if m == "dynamic":
        return ("dyntorch" if s.get("style") == "torch" else "dyn") + _fmt_num(s.get("interval", 0))
    if m == "adaptive":
        n = s.get("update_every", 1)
        return "adaptive" if n == 1 else f"adaptive-f{n}"
    return str(m)


def _make_trial_id(identity: dict) -> str:
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:8]
    readable = "-".join([
        identity["model"], f"bs{identity['batch_size']}", identity["precision"],
        _scaling_tag(identity["scaling"]), f"s{identity['seed']}",
    ])
    readable = _SAFE_ID_RE.sub("_", readable)
    return f"{readable}-{digest}"


# --------------------------------------------------------------------------- study


def _axis(v: Any):
    return _as_list(v)


def _scaling_axis(v: Any):
    if isinstance(v, dict):
        v = [v]
    v = _as_list(v)
    if isinstance(v, list):  # shorthand: `- adaptive` means `- {method: adaptive}`
        v = [{"method": e} if isinstance(e, str) else e for e in v]
    return v


def _check_name(v: Any):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = _fmt_num(v)
    if not isinstance(v, str):
        raise _err(f"expected a string, got {_show(v)}")
    if not _NAME_RE.fullmatch(v) or set(v) == {"."}:
        raise _err(f"{_show(v)} is not safe for file names", "letters, digits, '_', '.', '-'")
    return v


def _dataset_shorthand(v: Any):
    """``dataset: synthetic`` means ``dataset: {name: synthetic}``."""
    return {"name": v} if isinstance(v, str) else v


def _str_keys(v: Any):
    """YAML allows keys like ``1`` or ``yes`` (true); make them strings so they are named as unknown keys."""
    if isinstance(v, dict):
        return {(k if isinstance(k, str) else _show(k)): _str_keys(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_str_keys(x) for x in v]
    return v


def _check_description(v: Any):
    if v is None:
        return ""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _fmt_num(v)
    if not isinstance(v, str):
        raise _err(f"expected a string, got {_show(v)}")
    return v


class Study(BaseModel):
    """A validated study file. Build it with :func:`load_study` / :func:`load_study_text`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, BeforeValidator(_check_name)]
    description: Annotated[str, BeforeValidator(_check_description)] = ""
    dataset: Annotated[DatasetSpec, BeforeValidator(_dataset_shorthand)]
    model: Annotated[list[_choice("model", MODEL_NAMES)], BeforeValidator(_axis)]  # type: ignore[valid-type]
    batch_size: Annotated[list[PosInt], BeforeValidator(_axis)]  # type: ignore[valid-type]
    precision: _choice("precision", PRECISIONS)  # type: ignore[valid-type]
    scaling: Annotated[list[ScalingEntry], BeforeValidator(_scaling_axis)]
    seeds: Annotated[list[_number("int", ge=0, lt=2**32)], BeforeValidator(_axis)] = Field(  # type: ignore[valid-type]
        default_factory=lambda: [0])
    schedule: Schedule
    eval: Annotated[EvalSpec, BeforeValidator(_mapping_or_empty)] = Field(default_factory=EvalSpec)
    resources: Annotated[Resources, BeforeValidator(_mapping_or_empty)] = Field(default_factory=Resources)
    model_options: Annotated[ModelOptions, BeforeValidator(_mapping_or_empty)] = Field(default_factory=ModelOptions)
    divergence: Annotated[DivergenceSpec, BeforeValidator(_mapping_or_empty)] = Field(
        default_factory=DivergenceSpec)
    on_divergence: _choice("on_divergence policy", ("stop", "continue")) = "stop"  # type: ignore[valid-type]
    max_failures: NonNegInt = 2  # type: ignore[valid-type]
    log_every: PosInt = 10  # type: ignore[valid-type]
    loader: _choice("loader", ("torch", "dali")) = "torch"  # type: ignore[valid-type]
    #: the file it came from; set by the loader, not a key of the YAML schema
    source: str = _DEFAULT_SOURCE

    # -- cross-field checks (run after every field is valid) -----------------

    @model_validator(mode="after")
    def _combinations(self, info: ValidationInfo):
        src = _ctx_source(info) if getattr(info, "context", None) else self.source

        def fail(path, problem, allowed=None):
            raise StudyError(src, path, problem, allowed)

        sch = self.schedule
        if sch.warmup_iterations >= sch.iterations:
            fail("schedule.warmup_iterations",
                 f"{sch.warmup_iterations} must be < schedule.iterations ({sch.iterations})",
                 f"integers 0 <= x < {sch.iterations}")
        steps_allowed = f"increasing integers < schedule.iterations ({sch.iterations})"
        for i, s in enumerate(sch.lr_steps):
            if i and s <= sch.lr_steps[i - 1]:
                fail(f"schedule.lr_steps[{i}]", f"{s} is not greater than the previous step {sch.lr_steps[i - 1]}",
                     steps_allowed)
            if s >= sch.iterations:
                fail(f"schedule.lr_steps[{i}]", f"{s} is beyond the last iteration", steps_allowed)

        marked = [k for k, e in enumerate(self.scaling) if e.baseline]
        if len(marked) > 1:
            fail(f"scaling[{marked[1]}].baseline",
                 f"scaling[{marked[0]}] is already the baseline; at most one scaling entry may say baseline: true")

        tiny_only = {"width": self.model_options.width, "batch_norm": self.model_options.batch_norm}
        for k, e in enumerate(self.scaling):
            own = e.resources.given() if e.resources is not None else {}
            backend = own.get("backend", self.resources.backend)
            devices = own.get("devices_per_trial", self.resources.devices_per_trial)
            models = [e.model] if e.model is not None else self.model
            for opt, val in tiny_only.items():
                for m in models:
                    if val is not None and m != "ssd_tiny":
                        fail(f"model_options.{opt}",
                             f"only meaningful for ssd_tiny, but the grid has {m}"
                             + (f" (scaling[{k}].model)" if e.model is not None else ""))
            if e.batch_size is not None:
                bs_paths = [(f"scaling[{k}].batch_size", e.batch_size)]
            else:
                bs_paths = [(f"batch_size[{i}]", b) for i, b in enumerate(self.batch_size)]
            for path, b in bs_paths:
                if b % devices:
                    fail(path, f"{b} is not divisible by resources.devices_per_trial ({devices})",
                         f"multiples of {devices}")
            prec = e.precision if e.precision is not None else self.precision
            if backend == "xla" and prec == "mixed16":
                fail(f"scaling[{k}].precision" if e.precision is not None else "precision",
                     "mixed16 is not supported on backend xla (torch_xla has no fp16 autocast path); use bf16",
                     ", ".join(p for p in PRECISIONS if p != "mixed16"))
        return self

    # -- grid -------------------------------------------------------------------

    def trials(self) -> list[TrialConfig]:
        """model × batch_size × scaling entry × seed, overrides applied, duplicates collapsed.

        A ``baseline: true`` entry that collapses into an earlier identical one
        makes that earlier trial the baseline (it is the same training run).
        """
        out: list[TrialConfig] = []
        seen: dict[str, int] = {}  # trial_id -> index in out
        dataset = self.dataset.model_dump(mode="json")
        schedule = self.schedule.model_dump(mode="json")
        eval_ = self.eval.model_dump(mode="json")
        resources = self.resources.model_dump(mode="json")
        # only the options given: they are passed on as keyword arguments of the model builder
        model_options = self.model_options.model_dump(mode="json", exclude_none=True)
        divergence = self.divergence.model_dump(mode="json")
        for model in self.model:
            for bs in self.batch_size:
                for row, entry in enumerate(self.scaling):
                    ov = entry.overrides()
                    m = ov.get("model", model)
                    b = ov.get("batch_size", bs)
                    p = ov.get("precision", self.precision)
                    scaling = entry.normalized()
                    label = entry.label if entry.label is not None else default_label(scaling, p)
                    res = {**resources, **(entry.resources.given() if entry.resources is not None else {})}
                    for seed in self.seeds:
                        ident = _identity(m, b, p, scaling, seed, dataset, schedule, eval_, res,
                                          model_options, divergence, self.loader)
                        tid = _make_trial_id(ident)
                        if tid in seen:
                            if entry.baseline:
                                out[seen[tid]] = out[seen[tid]].model_copy(update={"baseline": True})
                            continue
                        seen[tid] = len(out)
                        out.append(TrialConfig(
                            study=self.name, trial_id=tid, model=m, batch_size=b, precision=p,
                            scaling=dict(scaling), label=label, row=row, seed=seed, baseline=entry.baseline,
                            dataset=dict(dataset), schedule=dict(schedule), eval=dict(eval_),
                            resources=dict(res), model_options=dict(model_options),
                            divergence=dict(divergence), on_divergence=self.on_divergence,
                            max_failures=self.max_failures, log_every=self.log_every, loader=self.loader,
                        ))
        return out


# --------------------------------------------------------------------------- labels and tables


def default_label(scaling: dict, precision: str) -> str:
    """The seed table's wording for a scaling entry (options missing from ``scaling`` take defaults)."""
    method = scaling.get("method")
    if method == "none":
        return "FP32 baseline" if precision == "fp32" else "no loss scale"
    if method == "fixed":
        scale = float(scaling.get("scale", 1.0))
        extra = "" if scaling.get("skip_nonfinite", True) else "no skip"
        if scale == 1.0:
            return "no loss scale" + (f" ({extra})" if extra else "")
        return f"loss scale ({_fmt_num(scale)}{', ' + extra if extra else ''})"
    if method == "dynamic":
        style = scaling.get("style", "chainer")
        d = _DYNAMIC_DEFAULTS.get(style, _DYNAMIC_DEFAULTS["chainer"])
        interval = scaling.get("interval")
        interval = d["interval"] if interval is None else interval
        parts = ["dynamic"] + (["torch"] if style == "torch" else []) + [f"interval={_fmt_num(interval)}"]
        init = scaling.get("init_scale")
        if init is not None and float(init) != d["init_scale"]:
            parts.append(f"init={_fmt_num(float(init))}")
        return f"loss scale ({', '.join(parts)})"
    if method == "adaptive":
        parts = []
        n = scaling.get("update_every", 1)
        if n != 1:
            parts.append(f"freq={n}")
        for key, short, default in (("n_uf_threshold", "n_uf", 1e-3), ("scale_upper_bound", "scale_ub", 16.0),
                                    ("accum_upper_bound", "accum_ub", 1024.0), ("init_scale", "init", 1.0)):
            v = scaling.get(key)
            if v is not None and float(v) != default:
                parts.append(f"{short}={_fmt_num(float(v))}")
        if scaling.get("power_of_two", True) is False:
            parts.append("no pow2")
        return "adaptive" + (f" ({', '.join(parts)})" if parts else "")
    return str(method)


_RAY_RESOURCE = {"cuda": "GPU", "xla": "TPU", "hpu": "HPU", "auto": "auto"}


def _resource_text(res: dict) -> str:
    # the real placement (multi-device trials: a small Tune bundle + one Train bundle per device)
    from .distributed import placement_text

    return placement_text(res)


def trial_table(trials: list[TrialConfig]) -> list[dict]:
    """Rows for ``lsbench run --dry-run``, in trial order."""
    return [
        {
            "trial_id": t.trial_id, "model": t.model, "batch_size": t.batch_size, "precision": t.precision,
            "label": t.label, "seed": t.seed, "backend": t.resources.get("backend", "cpu"),
            "resources": _resource_text(t.resources),
        }
        for t in trials
    ]


# --------------------------------------------------------------------------- loading


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (the later one would silently win)."""


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue  # SafeLoader reports unhashable keys itself
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_error(source: str, exc: yaml.YAMLError) -> StudyError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"invalid YAML: {problem}" + (f" ({context})" if context else "")
    return StudyError(source, where, text)


def _clean_loc(loc: tuple, raw: Any) -> tuple[list, Optional[str]]:
    """Drop pydantic's union tags and the index of scalar-wrapped lists; return (loc, tag model key)."""
    loc = list(loc)
    tag = None
    if loc[:1] == ["dataset"] and len(loc) > 1 and loc[1] in DATASET_NAMES:
        tag = ("dataset", loc.pop(1))
    elif loc[:1] == ["scaling"] and len(loc) > 2 and isinstance(loc[1], int) and loc[2] in SCALING_METHODS:
        tag = ("scaling", loc.pop(2))
    out: list = []
    node = raw
    for seg in loc:
        if isinstance(seg, int):
            if isinstance(node, list):
                node = node[seg] if 0 <= seg < len(node) else None
                out.append(seg)
            # else: the user wrote a scalar that we wrapped; no index to show
            continue
        node = node.get(seg) if isinstance(node, dict) else None
        out.append(seg)
    return out, tag


def _path_text(loc: list) -> str:
    s = ""
    for seg in loc:
        if isinstance(seg, int):
            s += f"[{seg}]"
        else:
            s += ("." if s else "") + str(seg)
    return s


def _allowed_keys(parent: list, tag) -> list[str]:
    if not parent:
        return [k for k in Study.model_fields if k != "source"]
    if tag and tag[0] == "scaling":
        return _scaling_keys(tag[1])
    if tag and tag[0] == "dataset":
        return list(DATASET_MODELS[tag[1]].model_fields)
    model = _SECTION_MODELS.get(parent[0])
    return list(model.model_fields) if model else []


_TYPE_WORDS = {
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "list_type": "a list", "string_type": "a string", "int_type": "an integer", "int_parsing": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
}


def _convert(source: str, exc: ValidationError, raw: Any) -> StudyError:
    errors = exc.errors(include_url=False)
    # an unknown key usually explains a 'missing' one (a typo): report it first
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc, tag = _clean_loc(tuple(first["loc"]), raw)
    etype = first["type"]
    ctx = first.get("ctx") or {}
    inp = first.get("input")
    allowed = None
    if etype == "lsbench":
        problem, allowed = ctx["problem"], ctx.get("allowed")
    elif etype == "extra_forbidden":
        keys = _allowed_keys(loc[:-1], tag)
        problem = f"unknown key{_suggest(loc[-1], keys)}"
        allowed = ", ".join(keys)
    elif etype == "missing":
        problem = "required key missing"
    elif etype in ("union_tag_invalid", "union_tag_not_found"):
        key, names, kind = (("method", SCALING_METHODS, "scaling method") if loc[:1] == ["scaling"]
                            else ("name", DATASET_NAMES, "dataset"))
        loc = loc + [key]
        allowed = ", ".join(names)
        if etype == "union_tag_not_found":
            problem = "required key missing"
        else:
            t = ctx.get("tag")
            problem = f"unknown {kind} {t!r}{_suggest(t, names)}"
    elif etype == "too_short":
        problem = "must not be empty"
    elif etype in _TYPE_WORDS:
        problem = f"expected {_TYPE_WORDS[etype]}, got {_show(inp)}"
    else:  # pragma: no cover - a pydantic error we did not anticipate; keep it one line
        problem = first.get("msg", etype)
    return StudyError(source, _path_text(loc) or "(top level)", problem, allowed)


def load_study_text(text: str, source: str = _DEFAULT_SOURCE, *, base_dir: str | os.PathLike | None = None) -> Study:
    """Validate a study given as YAML text. Relative paths resolve against ``base_dir``
    (default: the directory of ``source`` if it is a file path, else the working directory)."""
    source = str(source)
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise _yaml_error(source, exc) from None
    if raw is None:
        raise StudyError(source, "", "the file is empty; expected a mapping of study keys")
    if not isinstance(raw, dict):
        raise StudyError(source, "", f"the top level must be a mapping of study keys, got {type(raw).__name__}"
                         f" {_show(raw)}")
    raw = _str_keys(raw)
    if "source" in raw:
        keys = [k for k in Study.model_fields if k != "source"]
        raise StudyError(source, "source", "unknown key (set by the loader, not the file)", ", ".join(keys))
    if base_dir is None:
        base_dir = os.path.dirname(os.path.abspath(source)) if not source.startswith("<") else os.getcwd()
    data = dict(raw, source=source)
    try:
        return Study.model_validate(data, context={"source": source, "base_dir": str(base_dir)})
    except ValidationError as exc:
        raise _convert(source, exc, raw) from None


def load_study(path: str | os.PathLike) -> Study:
    """Read and validate a study file; every problem is a :class:`StudyError`."""
    source = str(path)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StudyError(source, "", "file not found") from None
    except IsADirectoryError:
        raise StudyError(source, "", "is a directory, not a study file") from None
    except UnicodeDecodeError as exc:
        raise StudyError(source, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise StudyError(source, "", f"cannot read: {exc.strerror or exc}") from None
    return load_study_text(text, source, base_dir=os.path.dirname(os.path.abspath(source)))
