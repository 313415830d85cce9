"""What a trial records besides step metrics: what the data loaders skipped, and the
per-layer table at each evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..engine.sink import Sink


def data_report(train_ds, val_ds) -> dict[str, Any]:
    """What the loaders skipped, as run tags: crowd boxes, COCO boxes of 1 px or less, difficult
    objects dropped, and (only with ``dataset.bad_annotations: drop``; the default is an error)
    impossible boxes and objects of classes outside the class list, with their reasons.
    Skips are counted and logged, never silent."""
    tags: dict[str, Any] = {}
    for split, ds in (("train", train_ds), ("val", val_ds)):
        tags[f"lsbench.data.{split}.images"] = len(ds)
        for attr in ("skipped_boxes", "crowd_boxes", "dropped_difficult"):
            v = getattr(ds, attr, None)
            if v:
                tags[f"lsbench.data.{split}.{attr}"] = int(v)
        for attr in ("unknown_objects", "dropped_annotations"):
            counts = getattr(ds, attr, None)
            if counts:
                tags[f"lsbench.data.{split}.{attr}"] = json.dumps(dict(counts), sort_keys=True)
    return tags


def write_layer_table(path: Path, rates: dict, scaler_rows: list[dict], sink: Sink) -> None:
    """The per-layer table at an evaluation: underflow rates (every method) and the per-layer methods' scales."""
    import csv

    by_layer: dict[str, dict] = {name: {"layer": name, **r} for name, r in rates.items()}
    for row in scaler_rows:
        by_layer.setdefault(row["layer"], {"layer": row["layer"]}).update(row)
    if not by_layer:
        return
    fields: list[str] = []
    for row in by_layer.values():
        fields += [k for k in row if k not in fields]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(by_layer.values())
    sink.artifact(str(path), "layers")
