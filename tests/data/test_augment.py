"""SSD augmentation invariants on random inputs: boxes stay valid and follow the pixels; deterministic."""

from __future__ import annotations

import numpy as np
import torch

from lossscale_bench.data.augment import SSDAugment, hsv_to_rgb, photometric_distort, rgb_to_hsv


def _random_sample(rng: np.random.Generator, h=None, w=None, n=None):
    h = h or int(rng.integers(20, 90))
    w = w or int(rng.integers(20, 90))
    n = n or int(rng.integers(1, 6))
    wh = rng.uniform(0.05, 0.9, size=(n, 2)) * [w, h]
    wh = np.maximum(wh, 2.0)
    xy = rng.uniform(0, 1, size=(n, 2)) * ([w, h] - wh)
    boxes = torch.tensor(np.concatenate([xy, xy + wh], 1), dtype=torch.float32)
    target = {
        "boxes": boxes,
        "labels": torch.arange(1, n + 1),
        "difficult": torch.tensor(rng.integers(0, 2, n) > 0),
        "image_id": 7,
    }
    image = torch.from_numpy(rng.uniform(0, 1, size=(3, h, w)).astype(np.float32))
    return image, target


def _check_valid(image, target, n_in):
    _, h, w = image.shape
    b = target["boxes"]
    assert b.dtype == torch.float32 and b.shape[1] == 4
    assert torch.isfinite(b).all()
    assert (b[:, 0] >= 0).all() and (b[:, 1] >= 0).all() and (b[:, 2] <= w).all() and (b[:, 3] <= h).all()
    assert ((b[:, 2:] - b[:, :2]) >= 1.0 - 1e-4).all()
    n = b.shape[0]
    assert target["labels"].shape == (n,) and target["difficult"].shape == (n,)
    assert target["image_id"] == 7
    if n_in:
        assert n >= 1  # a non-empty target stays non-empty
    assert image.min() >= 0 and image.max() <= 1 and torch.isfinite(image).all()


def test_boxes_stay_valid_on_random_inputs():
    aug = SSDAugment()
    rng = np.random.default_rng(0)
    sizes = set()
    for seed in range(150):
        image, target = _random_sample(rng)
        img2, tgt2 = aug(image, target, seed)
        _check_valid(img2, tgt2, len(target["boxes"]))
        assert set(tgt2["labels"].tolist()) <= set(target["labels"].tolist())
        sizes.add(tuple(img2.shape))
    assert len(sizes) > 50  # expand and crop really change the geometry


def test_deterministic_given_the_seed():
    rng = np.random.default_rng(1)
    image, target = _random_sample(rng, 60, 80, 3)
    aug = SSDAugment()
    a = aug(image, target, 1234)
    b = aug(image.clone(), {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in target.items()}, 1234)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1]["boxes"], b[1]["boxes"])
    outs = {tuple(aug(image, target, s)[1]["boxes"].flatten().tolist()) for s in range(20)}
    assert len(outs) > 10
    # the input is not modified in place
    assert torch.equal(image, _random_sample(np.random.default_rng(1), 60, 80, 3)[0])


def test_everything_off_is_identity():
    rng = np.random.default_rng(2)
    image, target = _random_sample(rng, 40, 50, 4)
    aug = SSDAugment(photometric=False, expand=False, crop=False, flip=False)
    img2, tgt2 = aug(image, target, 5)
    assert torch.equal(img2, image) and torch.equal(tgt2["boxes"], target["boxes"])
    assert torch.equal(tgt2["labels"], target["labels"])


def test_boxes_follow_the_pixels():
    """Objects are solid colours on a black image; after expand + crop + flip the pixels under
    every output box are still that object's colour (photometric off so colours are exact)."""
    colours = [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)]
    image = torch.zeros(3, 64, 96)
    boxes = torch.tensor([[4.0, 4.0, 30.0, 24.0], [40.0, 10.0, 60.0, 50.0], [70.0, 30.0, 92.0, 60.0]])
    for (x1, y1, x2, y2), c in zip(boxes.long().tolist(), colours):
        image[:, y1:y2, x1:x2] = torch.tensor(c).view(3, 1, 1)
    target = {
        "boxes": boxes,
        "labels": torch.tensor([1, 2, 3]),
        "difficult": torch.zeros(3, dtype=torch.bool),
        "image_id": 7,
    }
    aug = SSDAugment(photometric=False, fill=(0.5, 0.5, 0.5))
    for seed in range(60):
        img2, tgt2 = aug(image, target, seed)
        _check_valid(img2, tgt2, 3)
        for (x1, y1, x2, y2), lab in zip(tgt2["boxes"].tolist(), tgt2["labels"].tolist()):
            # integer-aligned input, integer crops and offsets: output boxes are integer-aligned too
            assert [x1, y1, x2, y2] == [round(v) for v in (x1, y1, x2, y2)]
            patch = img2[:, int(y1) : int(y2), int(x1) : int(x2)]
            expected = torch.tensor(colours[lab - 1]).view(3, 1, 1).expand_as(patch)
            assert torch.equal(patch, expected), (seed, lab)


def test_expand_fills_with_the_mean_and_keeps_the_image():
    image = torch.rand(3, 20, 30)
    target = {
        "boxes": torch.tensor([[0.0, 0.0, 30.0, 20.0]]),
        "labels": torch.tensor([1]),
        "difficult": torch.tensor([False]),
        "image_id": 7,
    }
    aug = SSDAugment(photometric=False, crop=False, flip=False, fill=(0.25, 0.5, 0.75))
    expanded = 0
    for seed in range(20):
        img2, tgt2 = aug(image, target, seed)
        x1, y1, x2, y2 = (int(v) for v in tgt2["boxes"][0].tolist())
        assert (x2 - x1, y2 - y1) == (30, 20)
        assert torch.equal(img2[:, y1:y2, x1:x2], image)
        if img2.shape != image.shape:
            expanded += 1
            mask = torch.ones(img2.shape[1:], dtype=torch.bool)
            mask[y1:y2, x1:x2] = False
            assert torch.allclose(img2[0][mask], torch.tensor(0.25)) and torch.allclose(
                img2[2][mask], torch.tensor(0.75)
            )
            assert max(img2.shape[1] / 20, img2.shape[2] / 30) <= 4.0
    assert 3 <= expanded <= 17  # p = 0.5


def test_out_size_and_empty_targets():
    rng = np.random.default_rng(3)
    image, target = _random_sample(rng, 50, 70, 2)
    img2, tgt2 = SSDAugment(out_size=32)(image, target, 9)
    assert img2.shape == (3, 32, 32)
    _check_valid(img2, tgt2, 2)
    empty = {
        "boxes": torch.zeros(0, 4),
        "labels": torch.zeros(0, dtype=torch.int64),
        "difficult": torch.zeros(0, dtype=torch.bool),
        "image_id": 7,
    }
    img3, tgt3 = SSDAugment()(image, empty, 3)
    assert tgt3["boxes"].shape == (0, 4) and img3.dim() == 3


def test_hsv_round_trip_and_distortion_range():
    x = torch.rand(3, 17, 19)
    assert torch.allclose(hsv_to_rgb(rgb_to_hsv(x)), x, atol=1e-5)
    grey = torch.full((3, 4, 4), 0.3)
    assert torch.allclose(hsv_to_rgb(rgb_to_hsv(grey)), grey, atol=1e-6)
    changed = 0
    for s in range(20):
        y = photometric_distort(x, np.random.default_rng(s))
        assert y.shape == x.shape and y.min() >= 0 and y.max() <= 1
        changed += not torch.allclose(y, x)
    assert changed >= 15


def test_augmented_dataset_wraps_a_loader_dataset():
    from lossscale_bench.data import fake_coco
    from lossscale_bench.data.augment import AugmentedDataset

    base = fake_coco(4, 64, 3, seed=0, train=True)
    ds = AugmentedDataset(base, SSDAugment())
    assert len(ds) == 4 and ds.class_names == base.class_names and ds.supports_aug_seed
    a, b = ds[(1, 99)], ds[(1, 99)]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1]["boxes"], b[1]["boxes"])
    img, t = ds[2]
    _, h, w = img.shape
    assert len(t["boxes"]) >= 1 and (t["boxes"][:, 2] <= w).all() and (t["boxes"][:, 3] <= h).all()
    assert torch.equal(ds.load(0)[0], base.load(0)[0])  # evaluation path untouched


def test_distorting_only_what_the_crop_keeps_equals_distorting_first():
    """SSDAugment applies the photometric distortion to the part of the image its crop keeps (photos:
    a third of the augmentation's time went to pixels thrown away); chainercv distorts the whole image
    first. Every op is per pixel and the fill is never distorted, so the two are the same bits."""
    from lossscale_bench.data.augment import apply_photometric

    class DistortFirst(SSDAugment):
        def _cut(self, image, crop, y_off, x_off, plan=()):
            return super()._cut(apply_photometric(image, plan) if plan else image, crop, y_off, x_off)

    rng = np.random.default_rng(11)
    for seed in range(60):
        image, target = _random_sample(rng)
        for kw in ({}, {"out_size": 48}):
            got, t_got = SSDAugment(**kw)(image, target, seed)
            want, t_want = DistortFirst(**kw)(image, target, seed)
            assert torch.equal(got, want) and torch.equal(t_got["boxes"], t_want["boxes"])
