"""``dataset.train_max_side`` (voc, voc0712): training photos shrunk once when read, boxes alike.

Why the option exists: on the kangaroo photos (long side up to 1000+ px) chainercv's augmentation
ran at the photo's resolution and was most of a 128-px step (studies/kangaroo_e4m3.yaml's comment
has the measurement). What must hold: the shrunk photo keeps its aspect and its boxes cover the same
pixels, validation photos are never shrunk, an XML size that is not the photo's is still refused,
and a study that does not set the option keeps the trial ids it had.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from lossscale_bench.data.transforms import PixelCache, read_image, shrink_to
from lossscale_bench.data.voc import VOCDetection, build_voc_datasets, make_tiny_voc
from lossscale_bench.dataset_files.annotations import AnnotationError
from lossscale_bench.study import StudyError, load_study_text
from lossscale_bench.study.grid import expand

RED = (230, 20, 20)


def _one_photo(tmp_path, size=(400, 200), box=(101, 51, 200, 150), xml_size=None):
    """A grey photo with a red block exactly under its one box (devkit 1-based xyxy)."""
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", size, (128, 128, 128))
    img.paste(RED, (box[0] - 1, box[1] - 1, box[2], box[3]))
    img.save(tmp_path / "JPEGImages" / "a.png")
    w, h = xml_size or size
    (tmp_path / "Annotations" / "a.xml").write_text(
        f"<annotation><filename>a.png</filename><size><width>{w}</width><height>{h}</height><depth>3</depth>"
        f"</size><object><name>roo</name><difficult>0</difficult><bndbox><xmin>{box[0]}</xmin><ymin>{box[1]}"
        f"</ymin><xmax>{box[2]}</xmax><ymax>{box[3]}</ymax></bndbox></object></annotation>"
    )
    (tmp_path / "ImageSets" / "Main" / "train.txt").write_text("a\n")
    return tmp_path


def test_shrink_keeps_the_aspect_and_leaves_small_images_alone():
    img = torch.rand(3, 300, 1000)
    out = shrink_to(img, 384)
    assert out.shape == (3, 115, 384) and float(out.min()) >= 0 and float(out.max()) <= 1
    assert shrink_to(img, 1000) is img and shrink_to(img, 2000) is img


def test_a_shrunk_photos_box_covers_the_same_pixels(tmp_path):
    root = _one_photo(tmp_path)
    ds = VOCDetection([(root, "train")], ["roo"], train=True, max_side=100)
    image, target = ds.load(0)
    assert image.shape == (3, 50, 100)
    box = target["boxes"][0]
    assert torch.allclose(box, torch.tensor([25.0, 12.5, 50.0, 37.5]))  # (100, 50, 200, 150) x 1/4
    x1, y1, x2, y2 = (int(v) for v in box)
    assert float(image[0, y1 + 1 : y2 - 1, x1 + 1 : x2 - 1].mean()) > 0.85  # red inside
    assert float(image[0, :, : x1 - 1].mean()) < 0.55  # grey left of it
    again, target2 = ds.load(0)  # from the cache: the same, and a tensor of its own
    assert torch.equal(again, image) and again.data_ptr() != image.data_ptr()
    assert torch.equal(target2["boxes"], target["boxes"])


def test_the_xml_size_is_still_checked_against_the_decoded_photo(tmp_path):
    root = _one_photo(tmp_path, xml_size=(300, 200))
    ds = VOCDetection([(root, "train")], ["roo"], train=True, max_side=100)
    with pytest.raises(AnnotationError, match="size"):
        ds.load(0)


def test_only_the_training_split_is_shrunk(tmp_path):
    year = tmp_path / "voc"
    make_tiny_voc(year, {"train": 3, "test": 2}, size=(96, 128))
    cfg = {
        "name": "voc",
        "root": str(year),
        "classes": ["square", "disc"],
        "train_split": "train",
        "val_split": "test",
        "train_max_side": 64,
        "augment": False,
    }
    train, val, _ = build_voc_datasets(cfg)
    assert max(train.load(0)[0].shape[-2:]) == 64
    assert tuple(val.load(0)[0].shape[-2:]) == (96, 128)
    assert torch.equal(val.load(0)[0], read_image(year / "JPEGImages" / f"{val.ids[0]}.jpg"))


def test_the_cache_keeps_the_shrunk_photo_not_the_decoded_one(tmp_path):
    root = _one_photo(tmp_path)
    cache = PixelCache(max_bytes=1 << 30)
    image, decoded = cache.read_scaled(root / "JPEGImages" / "a.png", (400, 200), 100)
    assert decoded == (400, 200) and cache.bytes == image.numel() * 4 == 3 * 50 * 100 * 4


STUDY = """\
name: roo
dataset: {{name: voc, root: {root}, classes: [roo], train_split: train, val_split: train{extra}}}
model: [ssd_tiny]
batch_size: [2]
precision: fp32
scaling: [{{method: none}}]
schedule: {{iterations: 2, lr: 0.01}}
"""


def test_the_option_is_validated_and_only_a_set_value_changes_the_trial_id(tmp_path):
    root = _one_photo(tmp_path / "d")
    ids = {}
    for extra in ("", ", train_max_side: null", ", train_max_side: 384"):
        study = load_study_text(STUDY.format(root=root, extra=extra), source="roo.yaml")
        ids[extra] = expand(study)[0]["trial_id"]
    assert ids[""] == ids[", train_max_side: null"] != ids[", train_max_side: 384"]
    with pytest.raises(StudyError) as err:
        load_study_text(STUDY.format(root=root, extra=", train_max_side: 16"), source="roo.yaml")
    assert "roo.yaml" in str(err.value) and "dataset.train_max_side" in str(err.value) and ">= 32" in str(err.value)
