"""The study file's ``dataset`` section: one pydantic model per data set, chosen by ``name``.

:data:`DatasetSpec` is the union the study's ``dataset`` key validates against (``synthetic``, ``voc``,
``voc0712``, ``coco2017``); :data:`DATASET_MODELS` maps each name to its model. Every model refuses
unknown keys, resolves ``root`` against the study file's folder and refuses a class listed twice.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Discriminator, Field, ValidationInfo, field_validator, model_validator

from ..core.registry import DATASET_NAMES, VOC_CLASSES
from ..dataset_files.annotations import BAD_ANNOTATIONS
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

__all__ = [
    "DATASET_MODELS",
    "BadAnnotations",
    "COCODataset",
    "DatasetSpec",
    "SyntheticDataset",
    "TrainMaxSide",
    "VOC0712Dataset",
    "VOCDataset",
]


class _DatasetBase(BaseModel):
    model_config = STRICT

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


#: ``dataset.bad_annotations`` (voc, voc0712, coco2017): a bad annotation (a class outside the
#: class list; an impossible, non-finite or wholly-outside box) is an error naming file, record and
#: value, or is dropped and counted in the run's tags (:mod:`.annotations`)
BadAnnotations = choice_field("dataset.bad_annotations policy", BAD_ANNOTATIONS)


class SyntheticDataset(_DatasetBase):
    name: Literal["synthetic"]
    root: OptStr = None
    train_images: PosInt = 512  # type: ignore[valid-type]
    val_images: PosInt = 128  # type: ignore[valid-type]
    image_size: number_field("int", ge=32) = 128  # type: ignore[valid-type]
    seed: NonNegInt = 0  # type: ignore[valid-type]


#: ``dataset.train_max_side`` (voc, voc0712): training photos are shrunk once, when first read, so that
#: their longer side is at most this many pixels (antialiased; boxes scaled alike) before the SSD
#: augmentation runs on them. Why: the augmentation's per-pixel work (photometric distortion, the
#: crop, the resize) runs at the photo's own resolution; on the kangaroo photos (median ~600 px, up to
#: 1000+) it was most of a 128-px step. Left out (the default): photos as stored. Validation photos
#: are never shrunk (the detector's own resize is the only one they get, so scores compare). Both
#: loaders apply it (``data.voc`` for torch's, ``data.dali`` after DALI's decode).
TrainMaxSide = number_field("int", ge=32, nullable=True, why="pixels of a training photo's longer side")


class VOCDataset(_DatasetBase):
    name: Literal["voc"]
    root: Str
    classes: ListOf(Str)  # type: ignore[valid-type]
    train_split: Str = "trainval"
    val_split: Str = "test"
    bad_annotations: BadAnnotations = "error"  # type: ignore[valid-type]
    train_max_side: TrainMaxSide = None  # type: ignore[valid-type]


class VOC0712Dataset(_DatasetBase):
    name: Literal["voc0712"]
    root: Str
    classes: ListOf(Str) = Field(default_factory=lambda: list(VOC_CLASSES))  # type: ignore[valid-type]
    train_split: Str = "trainval"
    val_split: Str = "test"
    bad_annotations: BadAnnotations = "error"  # type: ignore[valid-type]
    train_max_side: TrainMaxSide = None  # type: ignore[valid-type]


class COCODataset(_DatasetBase):
    name: Literal["coco2017"]
    root: OptStr = None
    fake_data: Bool = False
    bad_annotations: BadAnnotations = "error"  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _root_needed(self, info: ValidationInfo):
        if self.root is None and not self.fake_data:
            raise StudyError(ctx_source(info), "dataset.root", "required unless fake_data: true")
        return self


DATASET_MODELS: dict[str, type[_DatasetBase]] = {
    "synthetic": SyntheticDataset,
    "voc": VOCDataset,
    "voc0712": VOC0712Dataset,
    "coco2017": COCODataset,
}
assert tuple(DATASET_MODELS) == tuple(DATASET_NAMES)

DatasetSpec = Annotated[SyntheticDataset | VOCDataset | VOC0712Dataset | COCODataset, Discriminator("name")]
