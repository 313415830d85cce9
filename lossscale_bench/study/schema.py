"""The study file's schema: pydantic models of every section, the study and one trial.

Field types come from :mod:`.fields`; cross-field checks raise :class:`StudyError`
directly (they know the file from the validation context). Grid expansion,
trial ids and labels are in :mod:`.grid`; YAML and error wording in :mod:`.load`; the
``dataset`` section's models in :mod:`.datasets`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from ..core import plugins as registry
from ..core.plugins import PluginError
from ..core.registry import EQUIVALENCE_MARGIN_RANGE, EVAL_METRICS
from ..core.wording import suggest
from .as_written import AsWritten
from .datasets import DatasetSpec, ImportPathDataset, import_path_problems
from .entry_checks import check_grad_rounding, check_method_options, unique_labels
from .errors import StudyError, field_error, fmt_num, show_value
from .fields import (
    DEFAULT_SOURCE,
    STRICT,
    Bool,
    ListOf,
    NonNegInt,
    OptStr,
    PosFloat,
    PosInt,
    as_list,
    choice_field,
    ctx_base_dir,
    ctx_source,
    mapping_or_empty,
    model_field,
    number_field,
    resolve_path,
)
from .grid import expand
from .methods import ScalingEntry
from .models import model_entry, model_option_problems
from .precisions import PRECISION_NAMES
from .resources import Resources, check_repeatable
from .seed_plan import SeedPlan, SeedStreams, split_seed_plan
from .trial_config import TrialConfig

__all__ = [
    "MAX_NAME_CHARS",
    "SECTION_MODELS",
    "DivergenceSpec",
    "EvalSpec",
    "ModelOptions",
    "ReportSpec",
    "Schedule",
    "Study",
]

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")


# --------------------------------------------------------------------------- other sections


class Schedule(BaseModel):
    """Options in ``engine/schedule.py``'s terms (its docstring cites the references)."""

    model_config = STRICT

    iterations: PosInt  # type: ignore[valid-type]
    lr: PosFloat  # type: ignore[valid-type]
    warmup_iterations: NonNegInt = 0  # type: ignore[valid-type]
    #: 0 with linear warm-up: NVIDIA's/MLPerf's ramp from lr 0
    warmup_factor: number_field("float", ge=0, le=1) = 0.1  # type: ignore[valid-type]
    #: linear: ramp from warmup_factor to 1; constant: hold warmup_factor (the authors' chainer SSD)
    warmup_mode: choice_field("warmup_mode", ("linear", "constant")) = "linear"  # type: ignore[valid-type]
    lr_steps: ListOf(PosInt, nonempty=False) = Field(default_factory=list)  # type: ignore[valid-type]
    lr_gamma: PosFloat = 0.1  # type: ignore[valid-type]
    momentum: number_field("float", ge=0, lt=1) = 0.9  # type: ignore[valid-type]
    weight_decay: number_field("float", ge=0) = 5e-4  # type: ignore[valid-type]
    #: parameters without weight decay: bias (*.bias, chainercv), 1d (every 1-D parameter, NVIDIA)
    weight_decay_exclude: ListOf(
        choice_field("weight_decay_exclude entry", ("bias", "1d")),  # type: ignore[valid-type]
        nonempty=False,
    ) = Field(default_factory=list)
    grad_clip: number_field("float", gt=0, nullable=True) = None  # type: ignore[valid-type]
    bias_grad_factor: PosFloat = 1.0  # type: ignore[valid-type]
    #: torch: PyTorch SGD (lr applied to the momentum buffer); chainer: Chainer's MomentumSGD
    #: (lr applied to each gradient as it enters the velocity); they differ when lr changes
    momentum_style: choice_field("momentum_style", ("torch", "chainer")) = "torch"  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _warmup(self, info: ValidationInfo):
        if self.warmup_mode == "constant" and self.warmup_iterations and self.warmup_factor == 0:
            raise StudyError(
                ctx_source(info),
                "schedule.warmup_factor",
                "0 with warmup_mode: constant would train at lr 0 during the warm-up",
                "numbers 0 < x <= 1",
            )
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """Options added after studies ran are left out while at their default, so the
        schedule (part of every trial id) and the ids of existing studies do not change."""
        d = handler(self)
        for key, default in _SCHEDULE_LATE_DEFAULTS.items():
            if key in d and d[key] == default:
                del d[key]
        return d


#: schedule options whose default is not written into a trial's schedule (trial ids unchanged)
_SCHEDULE_LATE_DEFAULTS = {"warmup_mode": "linear", "weight_decay_exclude": [], "momentum_style": "torch"}


class EvalSpec(BaseModel):
    model_config = STRICT

    every: number_field("int", ge=1, nullable=True) = None  # type: ignore[valid-type]
    metric: choice_field("eval metric", EVAL_METRICS) = "coco"  # type: ignore[valid-type]
    max_images: number_field("int", ge=1, nullable=True) = None  # type: ignore[valid-type]


class ModelOptions(BaseModel):
    """The built-in models' options (each model's own are on the names page); a model from outside
    the package takes the keys its builder's signature names, checked by the study."""

    model_config = ConfigDict(extra="allow", frozen=True, validate_default=False)

    image_size: number_field("int", ge=32, nullable=True) = None  # type: ignore[valid-type]
    width: number_field("int", ge=4, nullable=True) = None  # type: ignore[valid-type]
    #: ssd_tiny only: BatchNorm after each backbone conv (the model's default: true)
    batch_norm: Bool | None = None
    backbone_weights: OptStr = None
    #: true: the batched multibox loss (models/multibox_loss.py), false: torchvision's per-image loop.
    #: Equal within float tolerance, not bitwise, so which one ran is in the trial id. Not given: the
    #: batched loss on accelerators, torchvision's on the CPU backend (grid.default_batched_loss).
    batched_loss: Bool | None = None

    @field_validator("backbone_weights", mode="after")
    @classmethod
    def _weights_abs(cls, v, info: ValidationInfo):
        return None if v is None else resolve_path(v, ctx_base_dir(info))


class DivergenceSpec(BaseModel):
    model_config = STRICT

    patience: PosInt = 10  # type: ignore[valid-type]
    max_consecutive_skips: PosInt = 200  # type: ignore[valid-type]


class ReportSpec(BaseModel):
    """How ``lsbench report`` reads the study's results.

    Nothing here changes what a trial trains or how it is scored, so no field
    enters a trial id, a configuration or a study setting: :func:`.grid.expand`
    never reads this section (tests/study/test_report_settings.py holds every
    shipped study's ids to that).
    """

    model_config = STRICT

    #: mAP points: a row whose two one-sided tests put its difference from another inside
    #: ±equivalence_margin is "equivalent"; the report's default (report/stats.py DEFAULT_MARGIN)
    equivalence_margin: number_field(
        "float",
        ge=EQUIVALENCE_MARGIN_RANGE[0],
        le=EQUIVALENCE_MARGIN_RANGE[1],  # type: ignore[valid-type]
        why="mAP points; mAP lies in 0-100",
    ) = 1.0


SECTION_MODELS: dict[str, type[BaseModel]] = {
    "schedule": Schedule,
    "eval": EvalSpec,
    "resources": Resources,
    "model_options": ModelOptions,
    "divergence": DivergenceSpec,
    "report": ReportSpec,
    "seed_streams": SeedStreams,
}


# --------------------------------------------------------------------------- study


def _scaling_axis(v: Any):
    """One mapping, or a list whose entries may be just the method (``- adaptive``)."""
    v = [v] if isinstance(v, dict) else as_list(v)
    if isinstance(v, list):
        v = [{"method": e} if isinstance(e, str) else e for e in v]
    return v


#: longest study name: it names an MLflow experiment, a folder and a report file (file systems stop at 255)
MAX_NAME_CHARS = 100


def _check_name(v: Any):
    """A study name is an identity (experiment, folder, report file): text as written, file-name safe."""
    if isinstance(v, AsWritten):
        raise field_error(
            f"YAML reads name: {v} as the {type(v.parsed).__name__} {show_value(v.parsed)}, not as the text "
            f'{str(v)!r}; write it in quotes (name: "{v}")'
        )
    if not isinstance(v, str):
        raise field_error(f"expected a string, got {show_value(v)}")
    if not _NAME_RE.fullmatch(v) or set(v) == {"."}:
        raise field_error(f"{show_value(v)} is not safe for file names", "letters, digits, '_', '.', '-'")
    if v.startswith("-"):  # `lsbench report --study -x` would read it as an option
        raise field_error(
            f"{show_value(v)} starts with '-', which command lines read as an option",
            "letters, digits, '_', '.', '-', not '-' first",
        )
    if len(v) > MAX_NAME_CHARS:
        raise field_error(
            f"{len(v)} characters is too long for a study name (it names folders and files)",
            f"at most {MAX_NAME_CHARS} characters",
        )
    return v


def _check_description(v: Any):
    if v is None:
        return ""
    if isinstance(v, AsWritten):
        return str(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt_num(v)
    if not isinstance(v, str):
        raise field_error(f"expected a string, got {show_value(v)}")
    return v


def _dataset_shorthand(v: Any):
    """``dataset: synthetic`` means ``dataset: {name: synthetic}``."""
    return {"name": v} if isinstance(v, str) else v


def _section(model: type[BaseModel]):
    """A section that may be left empty (``eval:``): its defaults."""
    return Annotated[model, BeforeValidator(mapping_or_empty)]


class Study(BaseModel):
    """A validated study file. Build it with :func:`~.load.load_study` / :func:`~.load.load_study_text`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, BeforeValidator(_check_name)]
    description: Annotated[str, BeforeValidator(_check_description)] = ""
    dataset: Annotated[DatasetSpec, BeforeValidator(_dataset_shorthand)]
    model: ListOf(model_field())  # type: ignore[valid-type]
    batch_size: ListOf(PosInt)  # type: ignore[valid-type]
    precision: choice_field("precision", PRECISION_NAMES)  # type: ignore[valid-type]
    scaling: Annotated[list[ScalingEntry], Field(min_length=1), BeforeValidator(_scaling_axis)]
    seeds: ListOf(number_field("int", ge=0, lt=2**32)) = Field(default_factory=lambda: [0])  # type: ignore[valid-type]
    schedule: Schedule
    eval: _section(EvalSpec) = Field(default_factory=EvalSpec)  # type: ignore[valid-type]
    resources: _section(Resources) = Field(default_factory=Resources)  # type: ignore[valid-type]
    model_options: _section(ModelOptions) = Field(default_factory=ModelOptions)  # type: ignore[valid-type]
    divergence: _section(DivergenceSpec) = Field(default_factory=DivergenceSpec)  # type: ignore[valid-type]
    on_divergence: choice_field("on_divergence policy", ("stop", "continue")) = "stop"  # type: ignore[valid-type]
    max_failures: NonNegInt = 2  # type: ignore[valid-type]
    log_every: PosInt = 10  # type: ignore[valid-type]
    #: not given: DALI on CUDA where nvidia.dali is importable, else torch (grid.default_loader)
    loader: choice_field("loader", ("torch", "dali")) = "torch"  # type: ignore[valid-type]
    #: report settings (the equivalence margin); not part of any trial id
    report: _section(ReportSpec) = Field(default_factory=ReportSpec)  # type: ignore[valid-type]
    #: which random streams follow the seed (SeedStreams); part of the id only where not the default
    seed_streams: _section(SeedStreams) = Field(default_factory=SeedStreams)  # type: ignore[valid-type]
    #: ``seeds`` in plan form (:mod:`.seed_plan`): seeds added until decided; None for the list form
    seed_plan: SeedPlan | None = None
    #: the file it came from; set by the loader, not a key of the YAML schema
    source: str = DEFAULT_SOURCE
    #: model name -> its registry entry (an import path resolved against the study file's folder)
    _models: dict = PrivateAttr(default_factory=dict)
    #: the study file's folder, where its import paths are found first
    _base_dir: str | None = PrivateAttr(default=None)
    #: the plug-in behind a data set named by import path (None: a registered data set)
    _dataset_plugin: Any = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _seeds_as_plan(cls, data: Any, info: ValidationInfo):
        return split_seed_plan(data, ctx_source(info))

    # -- cross-field checks (run after every field is valid) -----------------

    @model_validator(mode="after")
    def _combinations(self, info: ValidationInfo):
        src = ctx_source(info) if getattr(info, "context", None) else self.source

        found: list[StudyError] = []  # every problem, one line each (lsbench validate prints them all)

        def fail(path, problem, allowed=None):
            found.append(StudyError(src, path, problem, allowed))

        if self.seed_streams.val is not None and self.dataset.name != "synthetic":
            fail(
                "seed_streams.val",
                f"a validation set from a seed needs the synthetic dataset, not {self.dataset.name!r}",
                "seed_streams.val with dataset synthetic only",
            )
        sch = self.schedule
        if sch.warmup_iterations >= sch.iterations:
            fail(
                "schedule.warmup_iterations",
                f"{sch.warmup_iterations} must be < schedule.iterations ({sch.iterations})",
                f"integers 0 <= x < {sch.iterations}",
            )
        steps_allowed = f"increasing integers < schedule.iterations ({sch.iterations})"
        for i, s in enumerate(sch.lr_steps):
            if i and s <= sch.lr_steps[i - 1]:
                fail(
                    f"schedule.lr_steps[{i}]",
                    f"{s} is not greater than the previous step {sch.lr_steps[i - 1]}",
                    steps_allowed,
                )
            if s >= sch.iterations:
                fail(f"schedule.lr_steps[{i}]", f"{s} is beyond the last iteration", steps_allowed)

        marked = [k for k, e in enumerate(self.scaling) if e.baseline]
        if len(marked) > 1:
            fail(
                f"scaling[{marked[1]}].baseline",
                f"scaling[{marked[0]}] is already the baseline; at most one scaling entry may say baseline: true",
            )

        self._base_dir = ctx_base_dir(info) if getattr(info, "context", None) else None
        self._check_models(fail)
        if isinstance(self.dataset, ImportPathDataset):
            self._dataset_plugin, problems = import_path_problems(self.dataset, self._base_dir)
            for problem in problems:
                fail(*problem)
        for k, e in enumerate(self.scaling):
            own = e.resources.given() if e.resources is not None else {}
            backend = own.get("backend", self.resources.backend)
            devices = own.get("devices_per_trial", self.resources.devices_per_trial)
            if e.batch_size is not None:
                bs_paths = [(f"scaling[{k}].batch_size", e.batch_size)]
            else:
                bs_paths = [(f"batch_size[{i}]", b) for i, b in enumerate(self.batch_size)]
            for path, b in bs_paths:
                if b % devices:
                    fail(
                        path,
                        f"{b} is not divisible by resources.devices_per_trial ({devices})",
                        f"multiples of {devices}",
                    )
            prec = e.precision if e.precision is not None else self.precision
            if backend == "xla" and prec == "mixed16":
                fail(
                    f"scaling[{k}].precision" if e.precision is not None else "precision",
                    "mixed16 is not supported on backend xla (torch_xla has no fp16 autocast path); use bf16",
                    ", ".join(p for p in PRECISION_NAMES if p != "mixed16"),
                )
        check_repeatable(self, fail)
        unique_labels(self, fail)
        check_grad_rounding(self, fail)
        check_method_options(self, fail)
        if found:
            raise StudyError.of(list({str(p): p for p in found}.values()))
        return self

    def _check_models(self, fail) -> None:
        """Every model of the grid found (an import path: its module and callable), and every
        ``model_options`` key one that each of them takes."""
        where = [(f"model[{i}]", m) for i, m in enumerate(self.model)]
        where += [(f"scaling[{k}].model", e.model) for k, e in enumerate(self.scaling) if e.model is not None]
        grid: dict[str, list[str]] = {}  # model -> where it is named
        missing = False
        for path, m in where:
            if m not in self._models:
                try:
                    self._models[m] = model_entry(m, self._base_dir)
                except PluginError as exc:
                    fail(path, str(exc))
                    missing = True
                    continue
            grid.setdefault(m, []).append(path)
        if missing:  # which options it takes is not known: its error is the one to fix first
            return
        given = self.model_options.model_dump(mode="json", exclude_none=True)
        builtin_keys = list(ModelOptions.model_fields)
        for key in given:
            takers = [m for m, p in self._models.items() if not model_option_problems(p, {key: None})]
            if not takers:
                known = list(dict.fromkeys(builtin_keys + [o.name for p in self._models.values() for o in p.options]))
                fail(f"model_options.{key}", f"unknown key{suggest(key, known)}", ", ".join(known))
                continue
            for m, paths in grid.items():
                if m not in takers:
                    on = "" if paths[0].startswith("model[") else f" ({paths[0]})"
                    fail(f"model_options.{key}", f"only meaningful for {', '.join(takers)}, but the grid has {m}{on}")

    def plugin_dir(self) -> str | None:
        """The study file's folder: where its import paths are found first (a trial puts it on ``sys.path``)."""
        return self._base_dir

    def dataset_plugin(self):
        """The registry entry of this study's data set (one named by import path: resolved from the study's folder)."""
        if isinstance(self.dataset, ImportPathDataset):
            if self._dataset_plugin is None:
                self._dataset_plugin, _ = import_path_problems(self.dataset, self._base_dir)
            return self._dataset_plugin
        return registry.entry("dataset", self.dataset.name)

    def model_plugin(self, name: str):
        """The registry entry of a model of this study's grid."""
        if name not in self._models:
            self._models[name] = model_entry(name, self._base_dir)
        return self._models[name]

    def trials(self) -> list[TrialConfig]:
        """model × batch_size × scaling entry × seed, overrides applied, duplicates collapsed.

        A ``baseline: true`` entry that collapses into an earlier identical one
        makes that earlier trial the baseline (it is the same training run).
        """
        return [TrialConfig(**kwargs) for kwargs in expand(self)]
