"""Synthetic shapes generator: determinism, valid boxes, class balance, safe concurrent generation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from lossscale_bench.data import synthetic
from lossscale_bench.data.synthetic import CLASSES, ensure_synthetic

SMALL = dict(train_images=6, val_images=3, image_size=64)


def _tree_bytes(paths: dict) -> dict[str, bytes]:
    root = paths["root"]
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_and_coco_format(tmp_path):
    p = ensure_synthetic(tmp_path, seed=0, **SMALL)
    assert p["root"].parent == tmp_path and p["root"].name.startswith("synthetic-")
    assert "64px-6-3-s0" in p["root"].name
    assert p["classes"] == list(CLASSES)
    for split, n in (("train", 6), ("val", 3)):
        doc = json.loads(p[f"{split}_ann"].read_text())
        assert [c["id"] for c in doc["categories"]] == list(range(1, len(CLASSES) + 1))
        assert len(doc["images"]) == n
        assert len(list(p[f"{split}_images"].glob("*.png"))) == n
        for im in doc["images"]:
            with Image.open(p[f"{split}_images"] / im["file_name"]) as img:
                assert img.size == (64, 64) and img.mode == "RGB"
        per_image = Counter(a["image_id"] for a in doc["annotations"])
        assert all(1 <= per_image[im["id"]] <= 3 for im in doc["images"])
        for a in doc["annotations"]:
            assert a["iscrowd"] == 0 and a["area"] == pytest.approx(a["bbox"][2] * a["bbox"][3])


def test_same_seed_same_bytes_different_seed_differs(tmp_path):
    a = ensure_synthetic(tmp_path / "a", seed=3, **SMALL)
    b = ensure_synthetic(tmp_path / "b", seed=3, **SMALL)
    c = ensure_synthetic(tmp_path / "c", seed=4, **SMALL)
    ta, tb, tc = _tree_bytes(a), _tree_bytes(b), _tree_bytes(c)
    assert ta == tb
    assert ta.keys() == tc.keys()
    assert ta["annotations/train.json"] != tc["annotations/train.json"]
    assert sum(ta[k] != tc[k] for k in ta if k.endswith(".png")) == len(ta) - 2
    # train and val are different streams
    assert ta["train/000001.png"] != ta["val/000001.png"]


def test_second_call_reuses_the_cache(tmp_path):
    a = ensure_synthetic(tmp_path, seed=0, **SMALL)
    mtime = a["train_ann"].stat().st_mtime_ns
    b = ensure_synthetic(tmp_path, seed=0, **SMALL)
    assert a == b and b["train_ann"].stat().st_mtime_ns == mtime


def test_env_var_root(tmp_path, monkeypatch):
    monkeypatch.setenv("LSBENCH_DATA", str(tmp_path / "env"))
    p = ensure_synthetic(seed=0, **SMALL)
    assert p["root"].parent == tmp_path / "env"


def test_boxes_inside_and_non_degenerate_and_balanced(tmp_path):
    p = ensure_synthetic(tmp_path, train_images=240, val_images=0, image_size=64, seed=1)
    doc = json.loads(p["train_ann"].read_text())
    sizes = {im["id"]: (im["width"], im["height"]) for im in doc["images"]}
    for a in doc["annotations"]:
        x, y, w, h = a["bbox"]
        W, H = sizes[a["image_id"]]
        assert w > 1 and h > 1
        assert x >= 0 and y >= 0 and x + w <= W and y + h <= H
    counts = Counter(a["category_id"] for a in doc["annotations"])
    assert set(counts) == set(range(1, len(CLASSES) + 1))
    mean = sum(counts.values()) / len(counts)
    assert all(abs(c - mean) < 0.2 * mean for c in counts.values()), counts


def test_shapes_are_drawn_where_annotated(tmp_path):
    """The box interior differs from the pixels just outside it (the shape is really there)."""
    import numpy as np

    p = ensure_synthetic(tmp_path, train_images=20, val_images=0, image_size=128, seed=2)
    doc = json.loads(p["train_ann"].read_text())
    ok = total = 0
    for im in doc["images"]:
        arr = np.asarray(Image.open(p["train_images"] / im["file_name"]), dtype=np.float32)
        for a in doc["annotations"]:
            if a["image_id"] != im["id"]:
                continue
            x, y, w, h = (int(v) for v in a["bbox"])
            cx, cy = x + w // 2, y + h // 2
            inner = arr[cy - 1 : cy + 2, cx - 1 : cx + 2].reshape(-1, 3).mean(0)
            ring = np.concatenate(
                [arr[max(y - 3, 0) : y, x : x + w].reshape(-1, 3), arr[y + h : y + h + 3, x : x + w].reshape(-1, 3)]
            )
            if len(ring) == 0:
                continue
            total += 1
            ok += np.linalg.norm(inner - ring.mean(0)) > 40
    assert total > 20 and ok / total > 0.7


def test_lost_rename_race_uses_the_winner(tmp_path, monkeypatch):
    """If another process renames its copy into place first, ours is discarded and theirs returned."""
    real_write = synthetic._write_dataset

    def write_then_lose(out, **kw):
        real_write(out, **kw)
        winner = tmp_path / synthetic.dataset_dirname(**kw)
        real_write_dir = tmp_path / "winner-tmp"
        real_write_dir.mkdir()
        real_write(real_write_dir, **kw)
        os.rename(real_write_dir, winner)

    monkeypatch.setattr(synthetic, "_write_dataset", write_then_lose)
    p = ensure_synthetic(tmp_path, seed=0, **SMALL)
    assert p["val_ann"].is_file()
    assert sorted(x.name for x in tmp_path.iterdir()) == [p["root"].name]


def test_concurrent_processes_yield_one_valid_dataset(tmp_path):
    """Two processes released at the same moment both generate; one rename wins, both get a valid set."""
    import time

    root, sync = tmp_path / "data", tmp_path / "sync"
    sync.mkdir()
    code = (
        "import sys, time, pathlib; from lossscale_bench.data.synthetic import ensure_synthetic; "
        "sync = pathlib.Path(sys.argv[2]); (sync / ('ready' + sys.argv[3])).touch(); "
        "[time.sleep(0.01) for _ in iter(lambda: (sync / 'go').exists(), True)]; "
        "p = ensure_synthetic(sys.argv[1], train_images=40, val_images=10, image_size=64, seed=5); "
        "print(p['root'])"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(root), str(sync), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    deadline = time.time() + 120
    while len(list(sync.glob("ready*"))) < 2 and time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.02)
    (sync / "go").touch()
    outs = [pr.communicate(timeout=120) for pr in procs]
    assert all(pr.returncode == 0 for pr in procs), [o[1] for o in outs]
    roots = {o[0].strip() for o in outs}
    assert len(roots) == 1
    assert [x.name for x in root.iterdir()] == [Path(roots.pop()).name]  # no temp dirs left behind
    p = ensure_synthetic(root, train_images=40, val_images=10, image_size=64, seed=5)
    doc = json.loads(p["train_ann"].read_text())
    assert len(doc["images"]) == 40 and len(list(p["train_images"].glob("*.png"))) == 40
    ref = ensure_synthetic(tmp_path / "ref", train_images=40, val_images=10, image_size=64, seed=5)
    assert _tree_bytes(p) == _tree_bytes(ref)
