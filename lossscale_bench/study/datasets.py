"""The study file's ``dataset`` section: one pydantic model per data set, chosen by ``name``.

Each data set is a model class under ``@register_dataset`` (its keys are its fields, each documented
by the ``#:`` comment above it, here or in :class:`DatasetBase`); :data:`DatasetSpec` is the union the
study's ``dataset`` key validates against and :data:`DATASET_MODELS` maps each registered name to its
model (the package's: ``synthetic``, ``voc``, ``voc0712``, ``coco2017``; then those installed
distributions name in the entry-point group ``lossscale_bench.datasets``: a ``DatasetBase`` subclass
whose ``builder`` is the import path of ``builder(cfg: dict, *, image_size, max_val_images) ->
(train_ds, val_ds, class_names)``). Every model refuses unknown keys, resolves ``root`` against the
study file's folder and refuses a class listed twice.
"""

from __future__ import annotations

from importlib import import_module
from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator

from ..core import plugins
from ..core.registry import VOC_CLASSES
from ..dataset_files.annotations import BAD_ANNOTATIONS
from .described import field_options
from .errors import StudyError
from .fields import (
    STRICT,
    Bool,
    ListOf,
    NonNegInt,
    OptStr,
    PosInt,
    Str,
    choice_field,
    ctx_base_dir,
    ctx_source,
    number_field,
    resolve_path,
)
from .models.signature import import_path_plugin

__all__ = [  # noqa: F822 (DATASET_MODELS and DatasetSpec: module __getattr__)
    "DATASET_MODELS",
    "DATASET_NAMES",
    "DatasetBase",
    "IMPORT_PATH_TAG",
    "ImportPathDataset",
    "PASSED_BY_THE_TRIAL",
    "dataset_models",
    "import_path_problems",
    "register_dataset",
    "BadAnnotations",
    "COCODataset",
    "DatasetSpec",
    "SyntheticDataset",
    "TrainMaxSide",
    "VOC0712Dataset",
    "VOCDataset",
]


class DatasetBase(BaseModel):
    """What every data set's model has: unknown keys refused, ``root`` resolved, classes unique."""

    model_config = STRICT
    #: import path of what builds ``(train_ds, val_ds, class_names)`` from the section
    builder: ClassVar[str] = "lossscale_bench.data:build_datasets"
    #: bumped (start at 2) when the loader's code changes what a trial trains on (None: never bumped)
    version: ClassVar[int | None] = None

    @field_validator("root", mode="after", check_fields=False)
    @classmethod
    def _root_abs(cls, v, info: ValidationInfo):
        return None if v is None else resolve_path(v, ctx_base_dir(info))

    @model_validator(mode="after")
    def _unique_classes(self, info: ValidationInfo):
        seen: dict[str, int] = {}
        for i, c in enumerate(getattr(self, "classes", None) or ()):
            if c in seen:
                raise StudyError(
                    ctx_source(info), f"dataset.classes[{i}]", f"duplicate class {c!r} (also at index {seen[c]})"
                )
            seen[c] = i
        return self


def dataset_plugin(cls: type[DatasetBase], origin: str = plugins.BUILT_IN) -> plugins.Plugin:
    """The registry's description of the data set model ``cls`` (its name: the ``name`` literal)."""
    name = get_args(cls.model_fields["name"].annotation)[0]
    doc = (cls.__doc__ or "").strip().splitlines()
    keys = [k for k in cls.model_fields if k != "name"]
    return plugins.Plugin(
        kind="dataset",
        name=name,
        target=cls.builder,
        options=field_options(cls, keys),
        version=cls.version,
        origin=origin,
        description=cls,
        doc=doc[0] if doc else "",
    )


def register_dataset(cls: type[DatasetBase]) -> type[DatasetBase]:
    """Class decorator: register the data set model ``cls``."""
    p = dataset_plugin(cls)
    plugins.register("dataset", p.name, p.target, options=p.options, version=p.version, description=cls, doc=p.doc)
    return cls


def _describe_entry_point(name: str, target: str, origin: str) -> plugins.Plugin:
    """An entry point of ``lossscale_bench.datasets``: its value names a :class:`DatasetBase` subclass."""
    module, attr = target.split(":")
    try:
        cls = getattr(import_module(module), attr)
    except Exception as exc:  # noqa: BLE001 - whatever the plug-in's import raises is its error
        raise plugins.PluginError(f"dataset {name!r} ({origin}): cannot load {target}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, DatasetBase)) or dataset_plugin(cls).name != name:
        raise plugins.PluginError(f"dataset {name!r} ({origin}): {target} is not a DatasetBase subclass named {name!r}")
    return dataset_plugin(cls, origin)


#: ``dataset.bad_annotations`` (voc, voc0712, coco2017): a bad annotation (a class outside the
#: class list; an impossible, non-finite or wholly-outside box) is an error naming file, record and
#: value, or is dropped and counted in the run's tags (:mod:`.annotations`)
BadAnnotations = choice_field("dataset.bad_annotations policy", BAD_ANNOTATIONS)


@register_dataset
class SyntheticDataset(DatasetBase):
    """Generated images of squares and discs (cached on disk), for CPU studies and tests."""

    name: Literal["synthetic"]
    #: Its folder, relative to the study file (synthetic: its cache; not given: `$LSBENCH_DATA`).
    root: OptStr = None
    #: Synthetic training images.
    train_images: PosInt = 512  # type: ignore[valid-type]
    #: Synthetic validation images.
    val_images: PosInt = 128  # type: ignore[valid-type]
    #: Side of the synthetic images in pixels.
    image_size: number_field("int", ge=32) = 128  # type: ignore[valid-type]
    #: Seed the synthetic images are generated from.
    seed: NonNegInt = 0  # type: ignore[valid-type]


#: ``dataset.train_max_side`` (voc, voc0712): training photos are shrunk once, when first read, so that
#: their longer side is at most this many pixels (antialiased; boxes scaled alike) before the SSD
#: augmentation runs on them. Why: the augmentation's per-pixel work (photometric distortion, the
#: crop, the resize) runs at the photo's own resolution; on the kangaroo photos (median ~600 px, up to
#: 1000+) it was most of a 128-px step. Left out (the default): photos as stored. Validation photos
#: are never shrunk (the detector's own resize is the only one they get, so scores compare). Both
#: loaders apply it (``data.voc`` for torch's, ``data.dali`` after DALI's decode).
TrainMaxSide = number_field("int", ge=32, nullable=True, why="pixels of a training photo's longer side")


class AnnotatedDataset(DatasetBase):
    """A data set read from annotation files (VOC XML, COCO JSON)."""

    #: Its folder, relative to the study file (not given: `$LSBENCH_DATA`).
    root: OptStr = None
    #: An annotation naming a class outside the list, or an impossible, non-finite or wholly-outside
    #: box: error (one line naming file, record and value) or drop (skipped, counted in the run's tags).
    bad_annotations: BadAnnotations = "error"  # type: ignore[valid-type]


@register_dataset
class VOCDataset(AnnotatedDataset):
    """A folder in PASCAL VOC's layout (JPEGImages, Annotations, ImageSets/Main)."""

    name: Literal["voc"]
    root: Str
    #: The class names, in label order (as in the annotations).
    classes: ListOf(Str)  # type: ignore[valid-type]
    #: The training split's list file (ImageSets/Main/<split>.txt).
    train_split: Str = "trainval"
    #: The validation split's list file.
    val_split: Str = "test"
    #: Shrink training photos once, when first read, so that their longer side is at most this many
    #: pixels (boxes alike); validation photos are never shrunk. Not given: photos as stored.
    train_max_side: TrainMaxSide = None  # type: ignore[valid-type]


@register_dataset
class VOC0712Dataset(VOCDataset):
    """PASCAL VOC 2007+2012 (the SSD papers' training set), its 20 classes by default."""

    name: Literal["voc0712"]  # type: ignore[assignment]
    classes: ListOf(Str) = Field(default_factory=lambda: list(VOC_CLASSES))  # type: ignore[valid-type]


@register_dataset
class COCODataset(AnnotatedDataset):
    """COCO 2017 (train2017, val2017 and their instances JSON), or generated COCO-shaped data."""

    name: Literal["coco2017"]
    #: Generated COCO-shaped data instead of the real set.
    fake_data: Bool = False

    @model_validator(mode="after")
    def _root_needed(self, info: ValidationInfo):
        if self.root is None and not self.fake_data:
            raise StudyError(ctx_source(info), "dataset.root", "required unless fake_data: true")
        return self


class ImportPathDataset(DatasetBase):
    """A data set of your own, named by import path: ``dataset: {name: package.module:callable, ...}``.

    Its other keys are the callable's keyword arguments, checked against its signature by the study
    (:func:`import_path_problems`); ``root`` is resolved against the study file's folder like every
    data set's. The callable returns ``(train_ds, val_ds, class_names)``: two map-style data sets of
    ``(image, target)`` (a float CHW tensor in [0, 1]; ``{"boxes": (N, 4) xyxy pixels, "labels": (N,)
    1..K}``) and the K class names; it is also given ``image_size`` and ``max_val_images`` where its
    signature takes them (:data:`PASSED_BY_THE_TRIAL`)."""

    model_config = ConfigDict(extra="allow", frozen=True, validate_default=False)
    name: Str
    #: Its folder, relative to the study file (passed on only where the callable takes ``root``).
    root: OptStr = None


#: what the trial gives a data set's callable where its signature takes it (never a study key)
PASSED_BY_THE_TRIAL = plugins.OFFERED_PARAMS["dataset"]
#: the union's tag of a data set named by import path (no registered name can be this)
IMPORT_PATH_TAG = "<import path>"


def import_path_problems(ds: ImportPathDataset, base_dir: str | None) -> tuple[plugins.Plugin | None, list]:
    """The plug-in behind ``ds`` (None where it cannot be found) and ``(path, problem, allowed)`` for its
    module or callable missing, a key the callable does not take, and a parameter it needs not given."""
    try:
        plugin = import_path_plugin("dataset", ds.name, base_dir)
    except plugins.PluginError as exc:
        return None, [("dataset.name", str(exc), None)]
    given = {k for k, v in ds.model_dump(exclude_none=True).items() if k != "name"}
    known = [o.name for o in plugin.options if o.name not in PASSED_BY_THE_TRIAL]
    problems = []
    for key in sorted(given):
        if key in PASSED_BY_THE_TRIAL:
            problems.append((f"dataset.{key}", "given by the trial, not by the study", ", ".join(known) or "none"))
        elif key not in known and plugin.description != "any options":
            problems.append((f"dataset.{key}", f"not an option of {ds.name}", ", ".join(known) or "none"))
    problems += [(f"dataset.{k}", "required key missing", None) for k in plugin.required if k not in given]
    return plugin, problems


def _dataset_tag(value: Any) -> str | None:
    name = value.get("name") if isinstance(value, dict) else getattr(value, "name", None)
    return IMPORT_PATH_TAG if plugins.is_import_path(name) and name not in DATASET_NAMES else name


plugins.DESCRIBERS["dataset"] = _describe_entry_point
#: every data set name a study may use: the package's, then the entry points' (their names read from the
#: installed metadata; their models loaded when first needed)
DATASET_NAMES = plugins.names("dataset")
_MODELS: dict[str, type[DatasetBase]] = {}


def dataset_models() -> dict[str, type[DatasetBase]]:
    """name -> the data set's model (also as ``DATASET_MODELS``); entry points loaded on the first call
    (a broken one is left out here and named by ``lsbench plugins``)."""
    return plugins.load_descriptions("dataset", DATASET_NAMES, _MODELS)


def __getattr__(name: str):
    """``DATASET_MODELS`` and ``DatasetSpec`` (the union the ``dataset`` key validates against),
    computed when first read (PEP 562)."""
    if name == "DATASET_MODELS":
        return dataset_models()
    if name == "DatasetSpec":
        tagged = [Annotated[m, Tag(n)] for n, m in dataset_models().items()]
        tagged.append(Annotated[ImportPathDataset, Tag(IMPORT_PATH_TAG)])
        return Annotated[Union[tuple(tagged)], Discriminator(_dataset_tag)]  # type: ignore[valid-type]  # noqa: UP007
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
