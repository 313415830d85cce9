"""Check (and for the synthetic set, generate) a study's data before any trial starts.

A study whose data is missing must fail at once, naming the path it looked
at and the command that fetches it, not after Ray has started N trials that
each fail the same way.
"""

from __future__ import annotations

from pathlib import Path

from .coco import DataNotFound

FETCH = {
    "voc": "lsbench data voc --root {root}",
    "voc0712": "lsbench data voc --root {root}",
    "coco2017": "lsbench data coco --root {root}",
}


def _need(path: Path, name: str, root) -> None:
    if not path.exists():
        hint = FETCH.get(name, "").format(root=root)
        raise DataNotFound(f"dataset {name}: not found: {path}" + (f" (fetch it with: {hint})" if hint else ""))


def prepare_dataset(cfg: dict) -> None:
    """Raise ``DataNotFound`` if the data is absent; generate the synthetic set if needed."""
    name = cfg["name"]
    if name == "synthetic":
        from .synthetic import ensure_synthetic

        ensure_synthetic(
            cfg.get("root"),
            train_images=int(cfg.get("train_images", 512)),
            val_images=int(cfg.get("val_images", 128)),
            image_size=int(cfg.get("image_size", 128)),
            seed=int(cfg.get("seed", 0)),
        )
        return
    if name == "coco2017":
        if cfg.get("fake_data"):
            return
        root = Path(cfg["root"])
        for rel in (
            "annotations/instances_train2017.json",
            "annotations/instances_val2017.json",
            "train2017",
            "val2017",
        ):
            _need(root / rel, name, root)
        return
    if name in ("voc", "voc0712"):
        from .voc import voc_required_paths

        root = Path(cfg["root"])
        if name == "voc":
            # any VOC-format folder: `lsbench data voc` only helps when it is Pascal VOC itself
            for p in [root] + voc_required_paths(cfg):
                if not p.exists():
                    raise DataNotFound(
                        f"dataset voc: not found: {p} (root must be a VOC-format folder with Annotations/, "
                        f"JPEGImages/ and ImageSets/Main/<split>.txt; for Pascal VOC itself: "
                        f"lsbench data voc --root DIR, then root: DIR/VOCdevkit/VOC2007)"
                    )
            return
        _need(root, name, root)
        for p in voc_required_paths(cfg):
            _need(p, name, root)
        return
    # a data set registered elsewhere (a plug-in) reads or makes its files when its builder runs
