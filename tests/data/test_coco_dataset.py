"""CocoDetection (label mapping, flips, degenerate/crowd boxes), loaders, build_datasets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from lossscale_bench.data import (
    CocoDetection,
    DataNotFound,
    build_datasets,
    collate,
    fake_coco,
    infinite_batches,
    make_loader,
)
from lossscale_bench.data.synthetic import CLASSES

W, H = 40, 30


@pytest.fixture()
def tiny_coco(tmp_path):
    """3 images 40x30, sparse category ids 3/7/11, one crowd and two degenerate boxes."""
    img_dir = tmp_path / "images"
    img_dir.mkdir()
    rng = np.random.default_rng(0)
    images = []
    for i in (10, 20, 30):
        Image.fromarray(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(img_dir / f"{i}.png")
        images.append({"id": i, "file_name": f"{i}.png", "width": W, "height": H})
    anns = [
        {"image_id": 10, "category_id": 7, "bbox": [2, 3, 10, 8], "iscrowd": 0},
        {"image_id": 10, "category_id": 11, "bbox": [20, 5, 15, 20], "iscrowd": 0},
        {"image_id": 10, "category_id": 3, "bbox": [0, 0, 40, 30], "iscrowd": 1},  # crowd: ignored
        {"image_id": 20, "category_id": 3, "bbox": [5, 5, 1, 10], "iscrowd": 0},  # 1 px wide: dropped
        {"image_id": 20, "category_id": 3, "bbox": [39.5, 5, 10, 10], "iscrowd": 0},  # clipped to 0.5 px: dropped
        {"image_id": 30, "category_id": 3, "bbox": [30, 10, 12, 5], "iscrowd": 0},  # clipped to 10 px wide
    ]
    for k, a in enumerate(anns, start=1):
        a.update(id=k, area=a["bbox"][2] * a["bbox"][3])
    cats = [{"id": 11, "name": "c"}, {"id": 3, "name": "a"}, {"id": 7, "name": "b"}]
    ann_file = tmp_path / "ann.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return img_dir, ann_file


def test_label_mapping_round_trip(tiny_coco):
    ds = CocoDetection(*tiny_coco, train=False)
    assert ds.label_to_cat == {1: 3, 2: 7, 3: 11}
    assert ds.class_names == ["a", "b", "c"] and ds.num_classes == 3
    assert all(ds.cat_to_label[ds.label_to_cat[lab]] == lab for lab in ds.label_to_cat)
    image, target = ds[0]
    assert image.shape == (3, H, W) and image.dtype == torch.float32 and image.min() >= 0 and image.max() <= 1
    assert target["image_id"] == 10
    assert target["labels"].dtype == torch.int64 and target["boxes"].dtype == torch.float32
    assert [ds.label_to_cat[int(lab)] for lab in target["labels"]] == [7, 11]
    assert torch.equal(target["boxes"], torch.tensor([[2.0, 3.0, 12.0, 11.0], [20.0, 5.0, 35.0, 25.0]]))
    # the pycocotools object is there for evaluation and maps back to the same categories
    assert sorted(ds.coco.getCatIds()) == [3, 7, 11]


def test_crowd_and_degenerate_boxes(tiny_coco):
    val = CocoDetection(*tiny_coco, train=False)
    assert val.skipped_boxes == 2 and val.crowd_boxes == 1
    assert len(val) == 3 and val.image_ids == [10, 20, 30]
    assert val[1][1]["boxes"].shape == (0, 4)
    assert torch.equal(val[2][1]["boxes"], torch.tensor([[30.0, 10.0, 40.0, 15.0]]))  # clipped to the image
    train = CocoDetection(*tiny_coco, train=True)
    assert train.image_ids == [10, 30]  # no usable box in image 20: not a training sample
    assert CocoDetection(*tiny_coco, train=False, max_images=2).image_ids == [10, 20]


def test_flip_mirrors_image_and_boxes(tiny_coco):
    ds = CocoDetection(*tiny_coco, train=True)
    img, t = ds.load(0, flip=False)
    fimg, ft = ds.load(0, flip=True)
    assert torch.equal(fimg, img.flip(-1))
    assert torch.equal(ft["boxes"], torch.tensor([[W - 12.0, 3.0, W - 2.0, 11.0], [W - 35.0, 5.0, W - 20.0, 25.0]]))
    assert torch.equal(ft["labels"], t["labels"])
    # the pixels inside a box move with it
    x0, y0, x1, y1 = t["boxes"][0].int().tolist()
    fx0, _, fx1, _ = ft["boxes"][0].int().tolist()
    assert torch.equal(img[:, y0:y1, x0:x1].flip(-1), fimg[:, y0:y1, fx0:fx1])


def test_random_flips_keep_boxes_valid_and_are_seeded(tiny_coco):
    ds = CocoDetection(*tiny_coco, train=True)
    plain = ds.load(0)[1]["boxes"]
    flipped = 0
    for seed in range(40):
        _, t = ds[(0, seed)]
        b = t["boxes"]
        assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()
        assert (b[:, 0] >= 0).all() and (b[:, 2] <= W).all() and (b[:, 1] >= 0).all() and (b[:, 3] <= H).all()
        assert torch.equal(b, ds[(0, seed)][1]["boxes"])  # same seed, same decision
        flipped += not torch.equal(b, plain)
    assert 8 < flipped < 32
    # no flips without train or without hflip
    for ds2 in (CocoDetection(*tiny_coco, train=False), CocoDetection(*tiny_coco, train=True, hflip=False)):
        assert all(torch.equal(ds2[(0, s)][1]["boxes"], plain) for s in range(10))


def test_missing_files_raise_data_not_found(tmp_path, tiny_coco):
    with pytest.raises(DataNotFound, match="nowhere"):
        CocoDetection(tmp_path / "nowhere", tiny_coco[1], train=False)
    with pytest.raises(DataNotFound, match="missing.json"):
        CocoDetection(tiny_coco[0], tmp_path / "missing.json", train=False)


def test_build_datasets_coco2017_missing_root(tmp_path):
    with pytest.raises(DataNotFound, match=str(tmp_path / "coco")):
        build_datasets({"name": "coco2017", "root": str(tmp_path / "coco")})
    (tmp_path / "coco" / "train2017").mkdir(parents=True)
    (tmp_path / "coco" / "val2017").mkdir()
    with pytest.raises(DataNotFound, match="instances_train2017.json"):
        build_datasets({"name": "coco2017", "root": str(tmp_path / "coco")})
    with pytest.raises(DataNotFound):
        build_datasets({"name": "coco2017", "root": None})


def test_build_datasets_coco2017_layout(tmp_path, tiny_coco):
    import shutil

    img_dir, ann = tiny_coco
    root = tmp_path / "coco"
    (root / "annotations").mkdir(parents=True)
    for split in ("train", "val"):
        shutil.copytree(img_dir, root / f"{split}2017")
        shutil.copy(ann, root / "annotations" / f"instances_{split}2017.json")
    train, val, names = build_datasets({"name": "coco2017", "root": str(root)}, max_val_images=1)
    assert names == ["a", "b", "c"] and len(train) == 2 and len(val) == 1 and not val.hflip


def test_build_datasets_dispatches_voc_and_rejects_unknown_names(tmp_path):
    # VOC itself is tested in test_voc.py; here only that the branch is reached
    with pytest.raises(DataNotFound):
        build_datasets({"name": "voc0712", "root": str(tmp_path / "nowhere")})
    with pytest.raises(ValueError, match="unknown dataset"):
        build_datasets({"name": "imagenet"})


def test_build_datasets_synthetic(tmp_path):
    cfg = {"name": "synthetic", "root": str(tmp_path), "train_images": 8, "val_images": 4, "image_size": 64, "seed": 0}
    train, val, names = build_datasets(cfg, max_val_images=3)
    assert names == list(CLASSES)
    assert len(train) == 8 and len(val) == 3 and train.hflip and not val.hflip
    img, t = train[0]
    assert img.shape == (3, 64, 64) and len(t["labels"]) >= 1 and int(t["labels"].min()) >= 1


def test_fake_coco():
    ds = fake_coco(6, 48, 5, seed=1)
    assert len(ds) == 6 and ds.class_names == [f"class{k}" for k in range(1, 6)]
    img, t = ds.load(2)
    img2, t2 = fake_coco(6, 48, 5, seed=1).load(2)
    assert torch.equal(img, img2) and torch.equal(t["boxes"], t2["boxes"])
    assert img.shape == (3, 48, 48)
    b = t["boxes"]
    assert (b[:, 2:] - b[:, :2] > 1).all() and (b >= 0).all() and (b <= 48).all()
    assert ((t["labels"] >= 1) & (t["labels"] <= 5)).all()
    assert len(ds.coco.getAnnIds()) > 0
    train, val, names = build_datasets({"name": "coco2017", "root": None, "fake_data": True}, image_size=32)
    assert len(names) == 80 and train[0][0].shape == (3, 32, 32) and len(val) > 0


def _ids(batches):
    return [[int(t["image_id"]) for t in targets] for targets in batches]


def _flips(ds, batches_targets):
    # a flip shows in the first box: compare with the unflipped annotation
    out = []
    for targets in batches_targets:
        for t in targets:
            idx = ds.image_ids.index(int(t["image_id"]))
            out.append(not torch.equal(t["boxes"], ds.load(idx)[1]["boxes"]))
    return out


@pytest.fixture(scope="module")
def small_synth(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    train, _, _ = build_datasets(
        {"name": "synthetic", "root": str(root), "train_images": 10, "val_images": 2, "image_size": 32, "seed": 0}
    )
    return train


def test_make_loader_is_deterministic(small_synth):
    def run(seed):
        loader = make_loader(small_synth, 3, shuffle=True, seed=seed, drop_last=True)
        epochs = []
        for _ in range(2):
            targets = [t for _, t in loader]
            epochs.append((_ids(targets), _flips(small_synth, targets)))
        return epochs

    a, b, c = run(0), run(0), run(1)
    assert a == b and a != c
    assert a[0][0] != a[1][0]  # reshuffled each epoch
    assert all(len(batch) == 3 for batch in a[0][0]) and len(a[0][0]) == 3  # drop_last
    assert any(a[0][1]) and not all(a[0][1])
    ordered = make_loader(small_synth, 4, shuffle=False, seed=0, drop_last=False)
    assert sum(_ids([t for _, t in ordered]), []) == small_synth.image_ids
    images, targets = next(iter(ordered))
    assert isinstance(images, list) and isinstance(targets, list) and len(images) == 4


def test_infinite_batches_resume(small_synth):
    def take(start, n):
        out = []
        for step, _images, targets in infinite_batches(small_synth, 3, seed=7, start_step=start):
            out.append((step, [int(t["image_id"]) for t in targets], [t["boxes"] for t in targets]))
            if len(out) == n:
                return out

    full = take(0, 8)  # 3 steps per epoch: crosses two epoch boundaries
    assert [s for s, _, _ in full] == list(range(8))
    assert full[0][1] != full[3][1]
    for start in (2, 3, 5):
        resumed = take(start, 8 - start)
        for (s1, ids1, b1), (s2, ids2, b2) in zip(full[start:], resumed):
            assert s1 == s2 and ids1 == ids2
            assert all(torch.equal(x, y) for x, y in zip(b1, b2))


def test_infinite_batches_skips_without_loading(small_synth, monkeypatch):
    loaded = []
    real = type(small_synth).__getitem__
    monkeypatch.setattr(type(small_synth), "__getitem__", lambda self, k: loaded.append(k) or real(self, k))
    gen = infinite_batches(small_synth, 3, seed=0, start_step=1000)
    step, images, _ = next(gen)
    assert step == 1000 and len(images) == 3 and len(loaded) == 3


def test_collate():
    images, targets = collate([(torch.zeros(3, 2, 2), {"a": 1}), (torch.ones(3, 4, 4), {"a": 2})])
    assert [i.shape[-1] for i in images] == [2, 4] and [t["a"] for t in targets] == [1, 2]


def test_coco2017_training_split_is_augmented(tmp_path):
    """coco2017 trains with the SSD augmentation (as VOC does); evaluation data stays plain."""
    import json

    from helpers import coco_from_synthetic
    from lossscale_bench.data import build_datasets, infinite_batches
    from lossscale_bench.data.augment import AugmentedDataset

    root, _ = coco_from_synthetic(tmp_path, train_images=8, val_images=4, seed=3)
    assert json.loads((root / "annotations" / "instances_val2017.json").read_text())["images"]
    train, val, classes = build_datasets({"name": "coco2017", "root": str(root)}, image_size=64)
    assert isinstance(train, AugmentedDataset) and not isinstance(val, AugmentedDataset)
    step, images, targets = next(infinite_batches(train, 4, seed=0))
    assert len(images) == 4 and all(t["boxes"].shape[1] == 4 for t in targets)
