"""What real photos bring that the generated shapes do not: a JPEG short of its last bytes,
EXIF orientation tags (real, and the invalid 0 and 65537 the kangaroo photos carry), grayscale and
16-bit files, an XML whose size is not its image's, and boxes on the image border. Each is built here
as a one-image VOC folder, so these run without the kangaroo photos (tests/test_kangaroo.py uses them)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image, TiffImagePlugin

from lossscale_bench.data.augment import SSDAugment
from lossscale_bench.data.transforms import CorruptImage, hflip, read_image
from lossscale_bench.data.voc import VOCDetection
from lossscale_bench.dataset_files.annotations import AnnotationError
from lossscale_bench.evaluation.voc import evaluate_voc

RED = (230, 20, 20)


def _voc_folder(tmp_path, image: Image.Image, size, boxes, *, ext="jpg", exif=None, quality=95):
    """One image ``a`` with its XML (``size``: the XML's width, height; ``boxes``: devkit 1-based xyxy)."""
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    kw = {"quality": quality} if ext == "jpg" else {}
    if exif is not None:
        kw["exif"] = exif
    image.save(tmp_path / "JPEGImages" / f"a.{ext}", **kw)
    objects = "".join(
        f"<object><name>roo</name><difficult>0</difficult><bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin>"
        f"<xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>"
        for b in boxes
    )
    (tmp_path / "Annotations" / "a.xml").write_text(
        f"<annotation><filename>a.{ext}</filename><size><width>{size[0]}</width><height>{size[1]}</height>"
        f"<depth>3</depth></size>{objects}</annotation>"
    )
    (tmp_path / "ImageSets" / "Main" / "test.txt").write_text("a\n")
    return VOCDetection([(tmp_path, "test")], ["roo"], train=False)


def _orientation(value: int) -> bytes:
    """An EXIF block holding only the orientation tag, as a 32-bit value (00103's 65537 needs one)."""
    ifd = TiffImagePlugin.ImageFileDirectory_v2(prefix=b"II")
    ifd[0x0112] = value
    ifd.tagtype[0x0112] = 4  # LONG
    return b"Exif\x00\x00II\x2a\x00\x08\x00\x00\x00" + ifd.tobytes(8)


def _upright_photo():
    """40 wide, 60 tall, grey, with a red block at columns 5..19 and rows 30..54 (devkit box 6 31 20 55)."""
    img = Image.new("RGB", (40, 60), (128, 128, 128))
    img.paste(RED, (5, 30, 20, 55))
    return img, (6, 31, 20, 55)


def _red_inside(image: torch.Tensor, box) -> float:
    x1, y1, x2, y2 = (int(round(float(v))) for v in box)
    return float(image[0, y1 + 2 : y2 - 2, x1 + 2 : x2 - 2].mean())


def test_a_jpeg_short_of_its_last_bytes_is_decoded_with_a_note_naming_it(tmp_path, capsys):
    """The kangaroo set's 00090.jpg lacks its last 20 bytes; PIL refuses such a file, which failed the
    evaluation of every trial on the set (it is in the test split)."""
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 96, 3), dtype=np.uint8))
    whole = tmp_path / "whole.jpg"
    img.save(whole, quality=90)
    data = whole.read_bytes()
    expected = read_image(whole)
    for cut, rows in ((2, 64), (20, 40)):  # the end marker only: every pixel; part of the last 16 rows: above them
        short = tmp_path / f"short{cut}.jpg"
        short.write_bytes(data[:-cut])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = read_image(short)
            read_image(short)
        assert got.shape == (3, 64, 96)
        assert not caught  # a Python warning printed its source line under it, on every read
        err = capsys.readouterr().err
        assert err == (
            f"lsbench: note: {short}: the JPEG file is truncated (its end is missing); decoded with the "
            "missing blocks grey, as libjpeg does\n"
        ), err  # one line, once
        assert torch.equal(got[:, :rows], expected[:, :rows])
    # broken elsewhere: still refused, naming the file
    (tmp_path / "head.jpg").write_bytes(data[:200])
    with pytest.raises(CorruptImage, match="head.jpg"):
        read_image(tmp_path / "head.jpg")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    (tmp_path / "short.png").write_bytes(buf.getvalue()[:-200])
    with pytest.raises(CorruptImage, match="short.png"):
        read_image(tmp_path / "short.png")


def test_an_exif_rotation_is_applied_when_the_xml_describes_the_upright_photo(tmp_path):
    upright, box = _upright_photo()
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # orientation 6 displays it rotated back
    ds = _voc_folder(tmp_path, stored, upright.size, [box], exif=_orientation(6))
    image, target = ds.load(0)
    assert image.shape == (3, 60, 40)
    assert _red_inside(image, target["boxes"][0]) > 0.8


def test_an_exif_rotation_is_not_applied_when_the_xml_describes_the_stored_pixels(tmp_path):
    """labelImg and the VOC devkit read no EXIF: their boxes are on the stored pixels."""
    upright, box = _upright_photo()
    ds = _voc_folder(tmp_path, upright, upright.size, [box], exif=_orientation(8))
    image, target = ds.load(0)
    assert image.shape == (3, 60, 40) and _red_inside(image, target["boxes"][0]) > 0.8


@pytest.mark.parametrize("value", [0, 65537, 3])
def test_invalid_and_size_keeping_orientations_leave_the_stored_pixels(tmp_path, value):
    """0 and 65537 are on kangaroo photos 00076 and 00103; 3 (180 degrees) keeps the size, so the XML
    cannot tell which frame it describes, and the stored one is kept (as PIL and the devkit read it)."""
    upright, box = _upright_photo()
    ds = _voc_folder(tmp_path, upright, upright.size, [box], exif=_orientation(value))
    image, target = ds.load(0)
    assert image.shape == (3, 60, 40) and _red_inside(image, target["boxes"][0]) > 0.8


def test_an_xml_size_that_is_not_the_images_is_one_line_naming_both_files(tmp_path):
    """It used to clip the boxes to the image silently, training on boxes off their objects."""
    upright, box = _upright_photo()
    ds = _voc_folder(tmp_path, upright.resize((80, 120)), upright.size, [box])
    with pytest.raises(AnnotationError) as e:
        ds.load(0)
    text = str(e.value)
    assert len(text.splitlines()) == 1 and text.startswith(str(tmp_path / "Annotations" / "a.xml") + ": size: ")
    assert "40x60" in text and "80x120" in text and "a.jpg" in text and "bad_annotations" not in text


def test_grayscale_photos_become_three_equal_channels(tmp_path):
    gray = np.tile(np.arange(0, 240, 4, dtype=np.uint8), (40, 1))  # 40 rows x 60 columns
    Image.fromarray(gray, "L").save(tmp_path / "g.jpg", quality=95)
    got = read_image(tmp_path / "g.jpg")
    assert got.shape == (3, 40, 60) and torch.equal(got[0], got[1]) and torch.equal(got[1], got[2])
    assert abs(float(got[0, 20, 30]) - 120 / 255) < 0.03


def test_a_16_bit_grayscale_png_is_scaled_not_clipped_white(tmp_path):
    ramp = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (8, 1))
    Image.fromarray(ramp).save(tmp_path / "g16.png")
    got = read_image(tmp_path / "g16.png")
    assert got.shape == (3, 8, 64)
    assert float(got[0, 0, 0]) == 0.0 and float(got[0, 0, -1]) == 1.0
    assert abs(float(got[0, 0, 32]) - 32 / 63) < 1e-3  # PIL's RGB conversion gave 1.0 here


def test_boxes_on_the_border_stay_on_the_image_and_score_one_when_predicted_exactly(tmp_path):
    """xmin 1 and xmax = width (the devkit's first and last pixel), as 62 of the kangaroo set's 266 boxes."""
    img = Image.new("RGB", (50, 30), (128, 128, 128))
    boxes = [(1, 1, 20, 30), (30, 5, 50, 30)]
    ds = _voc_folder(tmp_path, img, img.size, boxes)
    image, target = ds.load(0)
    assert target["boxes"].tolist() == [[0.0, 0.0, 20.0, 30.0], [29.0, 4.0, 50.0, 30.0]]
    _, flipped = hflip(image, target["boxes"])
    assert flipped.tolist() == [[30.0, 0.0, 50.0, 30.0], [0.0, 4.0, 21.0, 30.0]]
    for seed in range(40):
        out, t = SSDAugment(out_size=64)(image, target, seed)
        b = t["boxes"]
        assert len(b) and (b >= 0).all() and (b[:, 0::2] <= out.shape[-1]).all() and (b[:, 1::2] <= out.shape[-2]).all()
        assert ((b[:, 2:] - b[:, :2]) > 0).all()

    class Exact(torch.nn.Module):
        def forward(self, images):
            return [
                {"boxes": target["boxes"], "labels": target["labels"], "scores": torch.tensor([0.9, 0.8])}
                for _ in images
            ]

    assert evaluate_voc(Exact(), ds, use_07_metric=True)["map"] == pytest.approx(1.0)


def _coco_folder(tmp_path, image: Image.Image, size, box_xywh, exif=None):
    import json

    from lossscale_bench.data.coco import CocoDetection

    (tmp_path / "img").mkdir(parents=True)
    image.save(tmp_path / "img" / "a.jpg", quality=95, **({"exif": exif} if exif is not None else {}))
    ann = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": size[0], "height": size[1]}],
        "annotations": [
            {
                "id": 1,
                "image_id": 1,
                "category_id": 3,
                "bbox": list(box_xywh),
                "iscrowd": 0,
                "area": box_xywh[2] * box_xywh[3],
            }
        ],
        "categories": [{"id": 3, "name": "roo"}],
    }
    (tmp_path / "ann.json").write_text(json.dumps(ann))
    return CocoDetection(tmp_path / "img", tmp_path / "ann.json", train=False)


def test_coco_format_follows_the_same_rotation_and_size_rules(tmp_path):
    upright, _ = _upright_photo()
    ds = _coco_folder(
        tmp_path / "a",
        upright.transpose(Image.Transpose.ROTATE_90),
        upright.size,
        (5, 30, 15, 25),
        exif=_orientation(6),
    )
    image, target = ds.load(0)
    assert image.shape == (3, 60, 40) and _red_inside(image, target["boxes"][0]) > 0.8
    ds = _coco_folder(tmp_path / "b", upright.resize((80, 120)), upright.size, (5, 30, 15, 25))
    with pytest.raises(AnnotationError) as e:
        ds.load(0)
    text = str(e.value)
    assert len(text.splitlines()) == 1 and text.startswith(f"{tmp_path / 'b' / 'ann.json'}: image 1 width, height: ")
    assert "40x60" in text and "80x120" in text
