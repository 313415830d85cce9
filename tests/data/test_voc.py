"""VOC-format data: parsing, coordinates, difficult handling, voc0712 composition, missing-data errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lossscale_bench.data.coco import DataNotFound
from lossscale_bench.data.prepare import prepare_dataset
from lossscale_bench.data.voc import VOCDetection, build_voc_datasets, make_tiny_voc
from lossscale_bench.dataset_files.annotations import AnnotationError
from lossscale_bench.dataset_files.voc_layout import resolve_devkit

XML = """<annotation><filename>{id}.jpg</filename><size><width>40</width><height>30</height><depth>3</depth></size>
<object><name>cat</name><difficult>0</difficult><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>10</xmax><ymax>20</ymax></bndbox></object>
<object><name>dog</name><difficult>1</difficult><bndbox><xmin>5</xmin><ymin>6</ymin><xmax>40</xmax><ymax>30</ymax></bndbox></object>
<object><name>zebra</name><bndbox><xmin>2</xmin><ymin>2</ymin><xmax>5</xmax><ymax>5</ymax></bndbox></object>
<object><name>dog</name><bndbox><xmin>3.5</xmin><ymin>4</ymin><xmax>8</xmax><ymax>9</ymax></bndbox></object>
</annotation>"""


def _hand_written(tmp_path):
    d = tmp_path / "hand"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (d / sub).mkdir(parents=True)
    from PIL import Image

    for i in ("a1", "a2"):
        (d / "Annotations" / f"{i}.xml").write_text(XML.format(id=i))
        Image.new("RGB", (40, 30), (10, 20, 30)).save(d / "JPEGImages" / f"{i}.jpg")
    (d / "Annotations" / "a3.xml").write_text(
        "<annotation><size><width>40</width><height>30</height></size>"
        "<object><name>dog</name><difficult>1</difficult><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax>"
        "<ymax>9</ymax></bndbox></object></annotation>"
    )
    Image.new("RGB", (40, 30)).save(d / "JPEGImages" / "a3.png")  # not .jpg: found by extension search
    (d / "ImageSets" / "Main" / "train.txt").write_text("a1\na3\n")
    (d / "ImageSets" / "Main" / "test.txt").write_text("a2\n\na3\n")
    return d


def test_parsing_coordinates_and_difficult(tmp_path):
    d = _hand_written(tmp_path)
    # a zebra in a cat/dog data set is an error by default, dropped and counted on request
    with pytest.raises(AnnotationError, match=r"a2\.xml: object 3: class 'zebra' is not in dataset.classes"):
        VOCDetection([(d, "test")], ["cat", "dog"], train=False)
    val = VOCDetection([(d, "test")], ["cat", "dog"], train=False, bad_annotations="drop")
    assert len(val) == 2 and val.ids == ["a2", "a3"] and val.num_classes == 2
    img, t = val.load(0)
    assert img.shape == (3, 30, 40) and img.dtype == torch.float32
    # 1-based inclusive -> continuous: (xmin - 1, ymin - 1, xmax, ymax)
    assert t["boxes"].tolist() == [[0.0, 0.0, 10.0, 20.0], [4.0, 5.0, 40.0, 30.0], [2.5, 3.0, 8.0, 9.0]]
    assert t["labels"].tolist() == [1, 2, 2] and t["difficult"].tolist() == [False, True, False]
    assert t["image_id"] == 0 and t["boxes"].dtype == torch.float32 and t["labels"].dtype == torch.int64
    assert val.unknown_objects["zebra"] == 1 and val.dropped_annotations == {"unknown_class": 1}
    img3, t3 = val[1]  # png, only a difficult object: kept for evaluation
    assert img3.shape == (3, 30, 40) and t3["difficult"].tolist() == [True]

    train = VOCDetection([(d, "train")], ["cat", "dog"], train=True, hflip=False, bad_annotations="drop")
    # difficult objects are dropped for training, then a3 has none left and is dropped too
    assert len(train) == 1 and train.dropped_difficult == 2
    _, t = train[0]
    assert t["labels"].tolist() == [1, 2] and not t["difficult"].any()


def test_tiny_generator_boxes_cover_the_shapes(tmp_path):
    d = tmp_path / "VOC2007"
    ids = make_tiny_voc(d, {"trainval": 6, "test": 3}, classes=("square", "disc"), seed=3)
    assert len(ids["trainval"]) == 6 and (d / "ImageSets/Main/train.txt").is_file()
    ds = VOCDetection([(d, "trainval")], ["square", "disc"], train=False)
    checked = 0
    for i in range(len(ds)):
        img, t = ds.load(i)
        for (x1, y1, x2, y2), lab in zip(t["boxes"].tolist(), t["labels"].tolist()):
            if lab != 1:
                continue
            x1, y1, x2, y2 = int(x1), int(y1), int(x2), int(y2)
            inside = img[:, y1 + 1 : y2 - 1, x1 + 1 : x2 - 1].mean(dim=(1, 2)) * 255
            assert abs(inside[0].item() - 220) < 25 and inside[1].item() < 80  # the red square fills its box
            checked += 1
    assert checked > 0


def test_voc0712_composition_and_root_resolution(tmp_path):
    dk = tmp_path / "VOCdevkit"
    make_tiny_voc(dk / "VOC2007", {"trainval": 5, "test": 3}, seed=1)
    make_tiny_voc(dk / "VOC2012", {"trainval": 4}, seed=2)
    for root in (tmp_path, dk):  # the folder holding VOCdevkit, or VOCdevkit itself
        assert resolve_devkit(root) == dk
        cfg = {
            "name": "voc0712",
            "root": str(root),
            "classes": ["square", "disc"],
            "train_split": "trainval",
            "val_split": "test",
            "augment": False,
            "hflip": False,
        }
        prepare_dataset(cfg)
        train, val, classes = build_voc_datasets(cfg)
        assert classes == ["square", "disc"]
        assert [str(d.name) for d, _ in train.sources] == ["VOC2007", "VOC2012"]
        everything = VOCDetection(train.sources, classes, train=False)
        assert len(everything) == 9 and len(val) == 3
        # training keeps the images with at least one non-difficult object
        assert len(train) == sum(bool((~everything.load(i)[1]["difficult"]).any()) for i in range(9)) >= 7
        assert val.ids == (dk / "VOC2007/ImageSets/Main/test.txt").read_text().split()
    # a custom voc dataset: one folder, joined split lists, max_images
    cfg = {
        "name": "voc",
        "root": str(dk / "VOC2012"),
        "classes": ["square", "disc"],
        "train_split": "train+val",
        "val_split": "val",
    }
    train, val, _ = build_voc_datasets(cfg, max_val_images=1)
    assert len(train) == 4 and len(val) == 1


def test_training_split_is_augmented_deterministically(tmp_path):
    d = tmp_path / "VOC2007"
    make_tiny_voc(d, {"trainval": 4, "test": 2}, seed=4)
    cfg = {"name": "voc", "root": str(d), "classes": ["square", "disc"]}
    train, val, _ = build_voc_datasets(cfg)
    assert train.augment is not None and val.augment is None
    a = train[(0, 123)]
    b = train[(0, 123)]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1]["boxes"], b[1]["boxes"])
    shapes = {tuple(train[(0, s)][0].shape) for s in range(12)}
    assert len(shapes) > 3
    for s in range(30):
        img, t = train[(s % len(train), s)]
        h, w = img.shape[1:]
        b = t["boxes"]
        assert len(b) >= 1 and (b[:, 2:] > b[:, :2]).all()
        assert (b[:, 0::2] <= w).all() and (b[:, 1::2] <= h).all() and (b >= 0).all()
        assert t["labels"].shape == t["difficult"].shape == (len(b),)
    img, t = val[0]  # evaluation: never transformed
    assert torch.equal(img, val.load(0)[0])


def test_missing_data_names_the_path_and_the_fetch_command(tmp_path):
    root = tmp_path / "nowhere"
    with pytest.raises(DataNotFound) as e:
        prepare_dataset({"name": "voc0712", "root": str(root), "train_split": "trainval", "val_split": "test"})
    msg = str(e.value)
    assert str(root) in msg and f"lsbench data voc --root {root}" in msg and "\n" not in msg
    # VOC2007 present but VOC2012 missing: the message names the first missing VOC2012 path
    make_tiny_voc(root / "VOCdevkit" / "VOC2007", {"trainval": 2, "test": 1})
    with pytest.raises(DataNotFound, match="VOC2012"):
        prepare_dataset({"name": "voc0712", "root": str(root), "train_split": "trainval", "val_split": "test"})
    # a split list that does not exist
    with pytest.raises(DataNotFound, match="ImageSets/Main/nosuch.txt"):
        prepare_dataset(
            {
                "name": "voc",
                "root": str(root / "VOCdevkit/VOC2007"),
                "classes": ["square"],
                "train_split": "nosuch",
                "val_split": "test",
            }
        )
    with pytest.raises(DataNotFound, match="Annotations"):
        prepare_dataset(
            {"name": "voc", "root": str(tmp_path), "classes": ["x"], "train_split": "trainval", "val_split": "test"}
        )


def test_wrong_class_list_is_a_clear_error(tmp_path):
    d = tmp_path / "VOC2007"
    make_tiny_voc(d, {"trainval": 3, "test": 1}, classes=("square", "disc"))
    with pytest.raises(
        AnnotationError,
        match=r"0000000\.xml: object 1: class '(square|disc)' is not in "
        r"dataset\.classes \['cat', 'dog'\]",
    ):
        build_voc_datasets({"name": "voc", "root": str(d), "classes": ["cat", "dog"]})
    with pytest.raises(DataNotFound, match="names found: 'square'|names found: 'disc'"):
        build_voc_datasets({"name": "voc", "root": str(d), "classes": ["cat", "dog"], "bad_annotations": "drop"})


def test_numpy_free_targets_collate_with_the_loader(tmp_path):
    from lossscale_bench.data import collate

    d = tmp_path / "VOC2007"
    make_tiny_voc(d, {"trainval": 3, "test": 1})
    train, _, _ = build_voc_datasets({"name": "voc", "root": str(d), "classes": ["square", "disc"]})
    images, targets = collate([train[(i, 7)] for i in range(len(train))])
    assert len(images) == len(targets) == 3
    assert all(isinstance(t["boxes"], torch.Tensor) and not isinstance(t["boxes"], np.ndarray) for t in targets)


def test_a_voc_format_folder_trains_through_run_trial(tmp_path):
    """Given only its root and class list, a VOC-format data set trains and is scored with the VOC07 metric."""
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.study import load_study_text
    from lossscale_bench.trial import run_trial

    root = tmp_path / "shapes"
    make_tiny_voc(root, {"trainval": 6, "test": 3}, classes=("square", "disc"), seed=5)
    study = load_study_text(f"""
name: tinyvoc
dataset: {{name: voc, root: {root}, classes: [square, disc]}}
model: [ssd_tiny]
model_options: {{width: 8, image_size: 64}}
batch_size: [2]
precision: fp32
scaling: [{{method: none}}]
schedule: {{iterations: 4, lr: 1.0e-3, warmup_iterations: 1}}
eval: {{every: 2, metric: voc07}}
resources: {{backend: cpu}}
log_every: 1
""")
    prepare_dataset(study.trials()[0].dataset)
    sink = MemorySink()
    out = run_trial(study.trials()[0], sink=sink, trial_dir=tmp_path / "trial", threads=1)
    assert out.status == "finished", out.error
    assert out.steps == 4 and out.final_map is not None and 0.0 <= out.final_map <= 1.0
    assert [s for s, _ in sink.history("map")] == [2, 4]
    assert sink.history("map_50")[-1][1] == out.final_map  # VOC: map and map_50 are the same number
    assert len(sink.history("loss")) == 4
