"""Data sets and loaders for the detectors.

``build_datasets(cfg)`` turns a study's ``dataset`` section into
``(train_ds, val_ds, class_names)``; ``make_loader`` and ``infinite_batches``
iterate them in an order fixed by a seed (and, through per-sample
augmentation seeds, with reproducible flips), so a run resumed at step ``s``
sees exactly the batches an uninterrupted run would have seen.

``class_names`` has K entries (no background): label ``i`` is
``class_names[i - 1]``; a detector needs ``num_classes = K + 1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Sampler

from ..core import plugins
from .coco import CocoDetection, DataNotFound, FakeCocoDetection, fake_coco, require_ground_truth
from .synthetic import CLASSES as SYNTHETIC_CLASSES
from .synthetic import ensure_synthetic

__all__ = [
    "CocoDetection",
    "DataNotFound",
    "FakeCocoDetection",
    "SYNTHETIC_CLASSES",
    "build_datasets",
    "collate",
    "dataset_problem",
    "ensure_synthetic",
    "fake_coco",
    "infinite_batches",
    "make_loader",
    "epoch_order",
    "sample_key",
]

_MOD = 1_000_003


def collate(batch):
    """``[(image, target), ...]`` -> ``([image, ...], [target, ...])`` (detectors take lists)."""
    images, targets = zip(*batch) if batch else ((), ())
    return list(images), list(targets)


def _aug_seed(seed: int, epoch: int, index: int) -> int:
    return ((int(seed) * _MOD + int(epoch)) * _MOD + int(index)) % (2**63)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The order of an epoch's ``n`` samples: shuffled by ``seed + epoch``, or as stored."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator().manual_seed(int(seed) + int(epoch))
    return torch.randperm(n, generator=g).tolist()


def sample_key(ds, seed: int, epoch: int, index: int):
    """What a dataset is indexed with: ``(index, augmentation seed)`` for a dataset that draws
    seeded augmentations (``supports_aug_seed``), else the index."""
    if getattr(ds, "supports_aug_seed", False):
        return (index, _aug_seed(seed, epoch, index))
    return index


class SeededSampler(Sampler):
    """Epoch ``e`` (counted from ``start_epoch``, one per ``iter()``) is a permutation seeded ``seed + e``."""

    def __init__(self, ds, *, seed: int, shuffle: bool, start_epoch: int = 0) -> None:
        self.ds, self.seed, self.shuffle, self.epoch = ds, int(seed), bool(shuffle), int(start_epoch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.ds)

    def __iter__(self):
        epoch = self.epoch
        self.epoch += 1
        for i in epoch_order(len(self.ds), self.seed, epoch, self.shuffle):
            yield sample_key(self.ds, self.seed, epoch, i)


def make_loader(ds, batch_size: int, *, shuffle: bool, seed: int, drop_last: bool, num_workers: int = 0) -> DataLoader:
    """A ``DataLoader`` yielding ``(images, targets)`` lists; order and flips fixed by ``seed``.

    Iterating it again starts the next epoch (permutation seeded ``seed + epoch``).
    """
    return DataLoader(
        ds,
        batch_size=batch_size,
        sampler=SeededSampler(ds, seed=seed, shuffle=shuffle),
        drop_last=drop_last,
        num_workers=num_workers,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(int(seed)),
        persistent_workers=False,
    )


def steps_per_epoch(ds, batch_size: int) -> int:
    return len(ds) // int(batch_size)


def infinite_batches(
    ds, batch_size: int, *, seed: int, start_step: int = 0, num_workers: int = 0
) -> Iterator[tuple[int, list, list]]:
    """Yield ``(step, images, targets)`` forever: full batches, reshuffled each epoch.

    Epoch ``e`` uses the permutation seeded ``seed + e`` (the incomplete last
    batch is dropped). ``start_step`` jumps straight to that step without
    loading the skipped samples, so a resumed run continues the same sequence.
    """
    spe = steps_per_epoch(ds, batch_size)
    if spe == 0:
        raise ValueError(f"data set has {len(ds)} samples, fewer than one batch of {batch_size}")
    step = int(start_step)
    epoch, offset = divmod(step, spe)
    while True:
        order = epoch_order(len(ds), seed, epoch, True)
        batches = [
            [sample_key(ds, seed, epoch, i) for i in order[b * batch_size : (b + 1) * batch_size]]
            for b in range(offset, spe)
        ]
        if num_workers > 0:
            loader = DataLoader(ds, batch_sampler=batches, num_workers=num_workers, collate_fn=collate)
            it = iter(loader)
        else:
            it = (collate([ds[k] for k in keys]) for keys in batches)
        for images, targets in it:
            yield step, images, targets
            step += 1
        epoch, offset = epoch + 1, 0


# ---------------------------------------------------------------------------
def _as_dict(cfg) -> dict:
    if cfg is None:
        return {}
    if hasattr(cfg, "model_dump"):
        return cfg.model_dump()
    return dict(cfg)


def _coco2017_paths(root: Path) -> dict:
    return {
        "train_images": root / "train2017",
        "train_ann": root / "annotations" / "instances_train2017.json",
        "val_images": root / "val2017",
        "val_ann": root / "annotations" / "instances_val2017.json",
    }


def build_datasets(dataset_cfg, *, image_size: int | None = None, max_val_images=None):
    """``(train_ds, val_ds, class_names)`` for a study's ``dataset`` section.

    synthetic: ``{"name": "synthetic", "root": None, "train_images": 512, "val_images": 128,
    "image_size": 128, "seed": 0}``; the images are generated at the config's
    ``image_size``, else the ``image_size`` argument, else 128.
    coco2017: ``{"name": "coco2017", "root": DIR, "fake_data": False}`` reads
    ``DIR/{train2017,val2017}`` and ``DIR/annotations/instances_{train,val}2017.json``;
    ``fake_data: True`` needs no files (``fake_train_images`` 64, ``fake_val_images`` 16,
    ``num_classes`` 80, images of the config's ``image_size``, else the argument, else 300 px).
    Optional for both: ``hflip`` (True), ``max_train_images``, ``max_val_images``
    (the argument wins over the config). coco2017, voc, voc0712: ``bad_annotations``
    (``error``, the default, or ``drop``: :mod:`lossscale_bench.dataset_files.annotations`).
    An evaluation set without images or objects to score raises ``AnnotationError``
    (a trial would otherwise finish with mAP 0.00).
    """
    cfg = _as_dict(dataset_cfg)
    name = cfg.get("name", "synthetic")
    hflip = bool(cfg.get("hflip", True))
    max_train = cfg.get("max_train_images")
    max_val = max_val_images if max_val_images is not None else cfg.get("max_val_images")

    if name == "synthetic":
        return _build_synthetic(cfg, image_size=image_size, hflip=hflip, max_train=max_train, max_val=max_val)
    if name == "coco2017":
        return _build_coco(cfg, image_size=image_size, hflip=hflip, max_train=max_train, max_val=max_val)
    if name in ("voc", "voc0712"):
        return _build_voc(cfg, image_size=image_size, max_val_images=max_val)
    if plugins.is_import_path(name) and name not in plugins.names("dataset"):
        return _build_import_path(name, cfg, image_size=image_size, max_val_images=max_val)
    return _build_registered(name, cfg, image_size=image_size, max_val_images=max_val)


def _build_import_path(name: str, cfg: dict, *, image_size, max_val_images):
    """A data set named by import path: ``callable(**options)``, the section's keys but ``name`` (and
    ``image_size``, ``max_val_images`` where its signature takes them), its return value checked."""
    import inspect
    from importlib import import_module

    module, attr = name.split(":")
    try:
        fn = getattr(import_module(module), attr)
    except Exception as exc:  # noqa: BLE001 - whatever the plug-in's import raises is its error
        raise plugins.PluginError(f"dataset {name}: cannot load it: {type(exc).__name__}: {exc}") from None
    kwargs = {k: v for k, v in cfg.items() if k != "name" and v is not None}
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    offered = {"image_size": image_size, "max_val_images": max_val_images}
    for key in plugins.OFFERED_PARAMS["dataset"]:
        if key in params or takes_any:
            kwargs[key] = offered[key]
    return dataset_problem(name, fn(**kwargs))


def dataset_problem(name: str, built):
    """``built`` as ``(train_ds, val_ds, class_names)`` when it is what a data set's builder returns, else a
    one-line :class:`PluginError` saying what it returned instead (checked on the first training sample)."""

    def bad(what: str):
        return plugins.PluginError(f"dataset {name} is not a data set: {what}")

    if not (isinstance(built, tuple) and len(built) == 3):
        raise bad(f"it returned {type(built).__name__}, not (train_ds, val_ds, class_names)")
    train, val, classes = built
    for which, ds in (("train_ds", train), ("val_ds", val)):
        if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
            raise bad(f"its {which} is a {type(ds).__name__}, not a map-style data set (__len__, __getitem__)")
        if len(ds) == 0:
            raise bad(f"its {which} is empty")
    if not (isinstance(classes, (list, tuple)) and classes and all(isinstance(c, str) for c in classes)):
        raise bad(f"class_names is {classes!r}, not a non-empty list of strings")
    sample = train[sample_key(train, 0, 0, 0)]
    if not (isinstance(sample, tuple) and len(sample) == 2 and isinstance(sample[0], torch.Tensor)):
        raise bad(f"train_ds[0] is {type(sample).__name__}, not (image tensor, target dict)")
    image, target = sample
    if image.dim() != 3 or not image.is_floating_point():
        raise bad(f"train_ds[0]'s image is a {image.dim()}-d {image.dtype} tensor, not a float C x H x W one")
    boxes, labels = (target.get(k) if isinstance(target, dict) else None for k in ("boxes", "labels"))
    if not (isinstance(boxes, torch.Tensor) and isinstance(labels, torch.Tensor)) or boxes.shape[-1:] != (4,):
        raise bad("train_ds[0]'s target is not {'boxes': (N, 4) tensor, 'labels': (N,) tensor, 'image_id': int}")
    if "image_id" not in target:
        raise bad("train_ds[0]'s target has no 'image_id' (what the evaluation tells its images apart by)")
    if labels.numel() and (int(labels.min()) < 1 or int(labels.max()) > len(classes)):
        raise bad(f"train_ds[0]'s labels run {int(labels.min())}..{int(labels.max())}, not 1..{len(classes)}")
    return train, val, list(classes)


def _build_registered(name: str, cfg: dict, *, image_size, max_val_images):
    """A data set described outside this module (its registry entry names the builder):
    ``builder(cfg, image_size=..., max_val_images=...) -> (train_ds, val_ds, class_names)``."""
    from importlib import import_module

    target = plugins.entry("dataset", name).target
    module, attr = target.split(":")
    return getattr(import_module(module), attr)(cfg, image_size=image_size, max_val_images=max_val_images)


def _build_synthetic(cfg: dict, *, image_size, hflip: bool, max_train, max_val):
    """synthetic: ``(train, val, class_names)``, generated (and cached) under the config's ``root``."""
    size = cfg.get("image_size") or image_size or 128
    paths = ensure_synthetic(
        cfg.get("root"),
        train_images=int(cfg.get("train_images", 512)),
        val_images=int(cfg.get("val_images", 128)),
        image_size=int(size),
        seed=int(cfg.get("seed", 0)),
    )
    train = CocoDetection(paths["train_images"], paths["train_ann"], train=True, hflip=hflip, max_images=max_train)
    if cfg.get("val_seed") is not None:  # a trial's own validation set (study seed_streams.val): the
        # one the dataset would have with that seed, generated (and cached) without its train split
        paths = {
            **paths,
            **{
                k: v
                for k, v in ensure_synthetic(
                    cfg.get("root"),
                    train_images=0,
                    val_images=int(cfg.get("val_images", 128)),
                    image_size=int(size),
                    seed=int(cfg["val_seed"]),
                ).items()
                if k.startswith("val")
            },
        }
    val = CocoDetection(paths["val_images"], paths["val_ann"], train=False, max_images=max_val)
    require_ground_truth(val, paths["val_ann"])
    return train, val, list(train.class_names)


def _build_coco(cfg: dict, *, image_size, hflip: bool, max_train, max_val):
    """coco2017: ``(train, val, class_names)`` from ``root`` (training split augmented), or fake data."""
    if cfg.get("fake_data"):
        size = cfg.get("image_size") or image_size or 300
        k = int(cfg.get("num_classes", 80))
        seed = int(cfg.get("seed", 0))
        n_val = int(cfg.get("fake_val_images", 16))
        if max_val is not None:
            n_val = min(n_val, int(max_val))
        train = fake_coco(int(cfg.get("fake_train_images", 64)), size, k, seed, train=hflip)
        val = fake_coco(n_val, size, k, seed + 1, train=False)
        return train, val, list(train.class_names)
    root = cfg.get("root")
    if not root:
        raise DataNotFound(
            "coco2017: dataset.root is not set (expected a folder holding train2017/, "
            "val2017/ and annotations/instances_{train,val}2017.json)"
        )
    paths = _coco2017_paths(Path(root).expanduser())
    for key in ("train_images", "val_images"):
        if not paths[key].is_dir():
            raise DataNotFound(f"coco2017: image folder not found: {paths[key]}")
    for key in ("train_ann", "val_ann"):
        if not paths[key].is_file():
            raise DataNotFound(f"coco2017: annotation file not found: {paths[key]}")
    policy = cfg.get("bad_annotations", "error")
    train = CocoDetection(
        paths["train_images"], paths["train_ann"], train=True, hflip=hflip, max_images=max_train, bad_annotations=policy
    )
    if cfg.get("augment", True):
        # the published studies' SSD recipe: photometric, zoom-out, IoU crop, flip (as for VOC)
        from .augment import AugmentedDataset, SSDAugment

        train = AugmentedDataset(train, SSDAugment(flip=hflip, out_size=image_size))
    val = CocoDetection(paths["val_images"], paths["val_ann"], train=False, max_images=max_val, bad_annotations=policy)
    require_ground_truth(val, paths["val_ann"])
    return train, val, list(train.class_names)


def _build_voc(cfg: dict, *, image_size=None, max_val_images=None):
    """voc / voc0712: ``(train, val, class_names)``; see ``data/voc.py`` (training split augmented)."""
    from .voc import build_voc_datasets

    return build_voc_datasets(cfg, image_size=image_size, max_val_images=max_val_images)
