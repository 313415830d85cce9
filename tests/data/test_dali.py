"""DALI input (CPU-only pipeline, device_id=None) against the PyTorch loader on the same images.

Boxes, labels and image ids must be identical; images equal up to float
rounding for PNG (synthetic) and up to JPEG decoder differences for VOC.
Skipped when nvidia-dali is not installed (the ``dali`` extra).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("nvidia.dali")

from lossscale_bench.data import build_datasets, infinite_batches  # noqa: E402
from lossscale_bench.data.dali import DaliBatches, DaliUnavailable, make_batches  # noqa: E402

SYN = {"name": "synthetic", "train_images": 12, "val_images": 4, "image_size": 64, "seed": 0}


def _compare(dali_it, torch_it, steps: int, image_atol: float, extra_keys=()) -> None:
    for _ in range(steps):
        s1, im1, tg1 = next(dali_it)
        s2, im2, tg2 = next(torch_it)
        assert s1 == s2
        assert len(im1) == len(im2)
        for a, b, ta, tb in zip(im1, im2, tg1, tg2):
            assert a.dtype == torch.float32 and a.shape == b.shape
            assert (a - b).abs().max().item() <= image_atol
            assert ta["image_id"] == tb["image_id"]
            assert torch.equal(ta["labels"], tb["labels"])
            assert torch.equal(ta["boxes"], tb["boxes"]), (ta["boxes"], tb["boxes"])
            for k in extra_keys:
                assert torch.equal(ta[k], tb[k])


@pytest.mark.parametrize("hflip", [False, True], ids=["augmentation-off", "hflip-on"])
def test_synthetic_coco_format_matches_dataloader(hflip):
    train, _, _ = build_datasets(dict(SYN, hflip=hflip))
    dali = DaliBatches(train, 4, seed=7, start_step=2)  # resumes mid-epoch like infinite_batches
    _compare(dali, infinite_batches(train, 4, seed=7, start_step=2), steps=4, image_atol=1e-6)
    if hflip:  # at least one sample was mirrored (boxes moved), the rest were not
        seen = [
            (t["image_id"], torch.equal(t["boxes"], train._records[train.image_ids.index(t["image_id"])]["boxes"]))
            for _ in range(3)
            for t in next(dali)[2]
        ]
        assert {same for _, same in seen} == {True, False}


def test_voc_matches_dataloader_with_and_without_ssd_augmentation(tmp_path):
    from lossscale_bench.data.voc import build_voc_datasets, make_tiny_voc

    make_tiny_voc(tmp_path / "VOC2007", {"trainval": 8, "test": 2}, seed=5)
    for augment in (False, True):
        cfg = {
            "name": "voc",
            "root": str(tmp_path / "VOC2007"),
            "classes": ["square", "disc"],
            "train_split": "trainval",
            "val_split": "test",
            "augment": augment,
            "hflip": True,
        }
        train, _, _ = build_voc_datasets(cfg)
        # JPEG: DALI's and PIL's decoders may round a few pixel values differently
        _compare(
            DaliBatches(train, 4, seed=1),
            infinite_batches(train, 4, seed=1),
            steps=3,
            image_atol=3 / 255 + 1e-6,
            extra_keys=("difficult",),
        )


def test_make_batches_switches_on_the_loader_and_refuses_recordless_data():
    from lossscale_bench.study import load_study_text

    text = (
        "name: d\ndataset: {name: synthetic, train_images: 12, val_images: 4, image_size: 64}\n"
        "model: ssd_tiny\nbatch_size: 4\nprecision: fp32\nscaling: [{method: none}]\nschedule: {iterations: 2, lr: 0.01, "
        "warmup_iterations: 0}\nloader: %s\n"
    )
    (cfg_t,) = load_study_text(text % "torch").trials()
    (cfg_d,) = load_study_text(text % "dali").trials()
    train, _, _ = build_datasets(SYN)
    it_t, it_d = make_batches(cfg_t, train, 3), make_batches(cfg_d, train, 3)
    assert isinstance(it_d, DaliBatches) and not isinstance(it_t, DaliBatches)
    assert next(it_d)[0] == next(it_t)[0] == 3
    fake, _, _ = build_datasets({"name": "coco2017", "fake_data": True, "fake_train_images": 8})
    with pytest.raises(DaliUnavailable, match="loader: torch"):
        next(DaliBatches(fake, 4, seed=0))


def test_voc_with_train_max_side_matches_dataloader(tmp_path):
    """``dataset.train_max_side``: DALI's decoded photo is shrunk and its boxes scaled as
    ``VOCDetection.load`` does it, before the mirror's boxes and the SSD augmentation."""
    from lossscale_bench.data.voc import build_voc_datasets, make_tiny_voc

    make_tiny_voc(tmp_path / "VOC2007", {"trainval": 8, "test": 2}, seed=5)
    for augment in (False, True):
        cfg = {
            "name": "voc",
            "root": str(tmp_path / "VOC2007"),
            "classes": ["square", "disc"],
            "train_split": "trainval",
            "val_split": "test",
            "augment": augment,
            "hflip": True,
            "train_max_side": 80,
        }
        train, _, _ = build_voc_datasets(cfg)
        if not augment:  # shrunk (make_tiny_voc's photos are 96 x 128)
            assert max(next(DaliBatches(train, 4, seed=1))[1][0].shape[-2:]) == 80
        _compare(
            DaliBatches(train, 4, seed=1),
            infinite_batches(train, 4, seed=1),
            steps=3,
            image_atol=3 / 255 + 1e-6,
            extra_keys=("difficult",),
        )
