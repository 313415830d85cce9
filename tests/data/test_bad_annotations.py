"""Bad or empty evaluation data (VOC, and the COCO annotations) is a one-line user error
naming the file and the record (``lsbench validate`` / ``run``, exit 2), or a ``failed`` trial with
that line, never a finished mAP 0.00; ``dataset.bad_annotations: drop`` drops and counts instead."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from helpers import coco_from_synthetic, tiny_data_study
from lossscale_bench.cli import main
from lossscale_bench.data import build_datasets
from lossscale_bench.data.voc import VOCDetection, make_tiny_voc
from lossscale_bench.dataset_files.annotations import AnnotationError
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.study import load_study_text
from lossscale_bench.trial import run_trial


def _study_file(tmp_path, dataset: str, eval_: str = "{metric: voc07}") -> str:
    f = tmp_path / "study.yaml"
    f.write_text(tiny_data_study(dataset, name="bad", eval=eval_))
    return str(f)


def _lsbench(capsys, *args) -> tuple[int, str, str]:
    """The real CLI in this process (an uncaught exception fails the test: no traceback reaches a user)."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lsbench: error: "), err
    assert "Traceback" not in err
    return lines[0]


# --------------------------------------------------------------------------- VOC


@pytest.fixture()
def voc(tmp_path):
    root = tmp_path / "shapes"
    ids = make_tiny_voc(root, {"trainval": 4, "test": 3}, classes=("square", "disc"), seed=3, difficult_every=1000)
    return root, ids["test"]


def _val_xml(root, ids, k=0):
    path = root / "Annotations" / f"{ids[k]}.xml"
    return path, ET.parse(path)


def _edit_first_object(root, ids, **fields):
    """Set fields of the first object of the first evaluation image (name, difficult, xmin, ...)."""
    path, tree = _val_xml(root, ids)
    obj = tree.getroot().find("object")
    for tag, value in fields.items():
        node = obj.find(tag) if tag in ("name", "difficult") else obj.find("bndbox").find(tag)
        node.text = str(value)
    tree.write(path)
    return path, obj.find("name").text


def _voc_dataset(root, extra=""):
    return f"{{name: voc, root: {root}, classes: [square, disc]{extra}}}"


def test_an_empty_evaluation_split_is_refused_before_training(voc, tmp_path, capsys):
    root, _ = voc
    (root / "ImageSets" / "Main" / "test.txt").write_text("")
    f = _study_file(tmp_path, _voc_dataset(root))
    for cmd in (("validate", f), ("run", f, "--runs-dir", tmp_path / "runs", "--executor", "local")):
        code, out, err = _lsbench(capsys, *cmd)
        line = _one_error_line(err)
        assert code == 2 and "dataset.val_split" in line, line
        assert f"{root / 'ImageSets' / 'Main' / 'test.txt'} lists no images" in line
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # refused before any store or trial


@pytest.mark.parametrize("how", ["no objects", "only difficult"])
def test_an_evaluation_split_without_objects_to_score_is_refused(voc, tmp_path, capsys, how):
    root, ids = voc
    for k in range(len(ids)):
        path, tree = _val_xml(root, ids, k)
        for obj in list(tree.getroot().iter("object")):
            if how == "no objects":
                tree.getroot().remove(obj)
            else:
                obj.find("difficult").text = "1"
        tree.write(path)
    code, _, err = _lsbench(capsys, "validate", _study_file(tmp_path, _voc_dataset(root)))
    line = _one_error_line(err)
    assert (
        code == 2
        and "dataset.val_split: no objects of dataset.classes that are not difficult in the 3 "
        f"images of {root / 'ImageSets' / 'Main' / 'test.txt'}"
        in line
    ), line


def test_no_objects_among_the_evaluated_images_counts_eval_max_images(voc, tmp_path, capsys):
    root, ids = voc
    path, tree = _val_xml(root, ids)
    for obj in list(tree.getroot().iter("object")):
        tree.getroot().remove(obj)
    tree.write(path)
    f = _study_file(tmp_path, _voc_dataset(root), "{metric: voc07, max_images: 1}")
    code, _, err = _lsbench(capsys, "validate", f)
    assert code == 2 and "in the first 1 images of" in _one_error_line(err)
    code, out, err = _lsbench(capsys, "validate", _study_file(tmp_path, _voc_dataset(root)))
    assert code == 0, err  # the other two images have objects


CASES = {  # field edits of one object -> what the line must show
    "class in other case": (
        {"name": "Square"},
        "class 'Square' is not in dataset.classes ['square', 'disc'] (did you mean 'square'?)",
    ),
    "box outside the image": ({"xmin": 200, "xmax": 220}, "lies outside the 128x96 image"),
    "xmin > xmax": ({"xmin": 50, "xmax": 20}, "xmin 50 > xmax 20"),
    "nan coordinate": ({"ymin": "nan"}, "ymin nan"),
    "not a number": ({"xmax": "12px"}, "xmax 12px"),
    "difficult not 0/1": ({"difficult": "yes"}, "difficult 'yes' is neither 0 nor 1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_annotation_is_one_line_naming_file_object_and_value(voc, tmp_path, capsys, case):
    root, ids = voc
    edits, shown = CASES[case]
    xml, _ = _edit_first_object(root, ids, **edits)
    f = _study_file(tmp_path, _voc_dataset(root))
    code, _, err = _lsbench(capsys, "validate", f)
    line = _one_error_line(err)
    assert code == 2 and f"{f}: dataset: {xml}: object 1" in line and shown in line, line
    assert "dataset.bad_annotations: drop" in line
    # the loader applies the same rule (a trial started without validate fails with the same words)
    with pytest.raises(AnnotationError, match=re.escape(shown)):
        VOCDetection([(root, "test")], ["square", "disc"], train=False)


def test_dropped_annotations_are_counted_and_never_reach_the_targets(voc):
    root, ids = voc
    _edit_first_object(root, ids, ymin="nan")
    path, tree = _val_xml(root, ids, 1)
    tree.getroot().find("object").find("name").text = "Square"
    tree.write(path)
    val = VOCDetection([(root, "test")], ["square", "disc"], train=False, bad_annotations="drop")
    assert val.dropped_annotations == {"non_finite": 1, "unknown_class": 1}
    assert dict(val.unknown_objects) == {"Square": 1} and val.skipped_boxes == 1
    for i in range(len(val)):
        boxes = val.load(i)[1]["boxes"]
        assert all(math.isfinite(v) for v in boxes.flatten().tolist())


def test_drop_runs_and_records_the_counts_on_the_trial_run(voc, tmp_path, capsys):
    from mlflow import MlflowClient

    root, ids = voc
    _edit_first_object(root, ids, name="Square")
    f = _study_file(tmp_path, _voc_dataset(root, ", bad_annotations: drop"), "{metric: voc07, max_images: 3}")
    code, out, err = _lsbench(capsys, "validate", f)
    assert code == 0, err
    code, out, err = _lsbench(capsys, "run", f, "--runs-dir", tmp_path / "runs", "--executor", "local", "--no-report")
    assert code == 0, err
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bad")
    (run,) = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    assert run.info.status == "FINISHED"
    assert json.loads(run.data.tags["lsbench.data.val.unknown_objects"]) == {"Square": 1}
    assert run.data.params["dataset.bad_annotations"] == "drop"
    # and the report says so under its table (the numbers were computed without that object)
    code, out, err = _lsbench(capsys, "report", "--runs-dir", tmp_path / "runs", "--out", "-", "--no-plots")
    assert code == 0, err
    assert "Data: annotations dropped under dataset.bad_annotations: drop: val 1 (unknown class Square 1)." in out


def test_a_validated_study_whose_data_changed_fails_its_trial_not_finishes_at_zero(voc, tmp_path):
    """The loader's own guard: no objects among the evaluated images -> a failed trial with the reason."""
    root, ids = voc
    study = load_study_text(tiny_data_study(_voc_dataset(root), name="bad"))
    (root / "ImageSets" / "Main" / "test.txt").write_text(ids[0] + "\n")  # after validation
    path, tree = _val_xml(root, ids)
    for obj in list(tree.getroot().iter("object")):
        tree.getroot().remove(obj)
    tree.write(path)
    sink = MemorySink()
    out = run_trial(study.trials()[0], sink=sink, trial_dir=tmp_path / "t", threads=1)
    assert out.status == "failed" and out.final_map is None
    assert out.error == (
        f"AnnotationError: {root / 'ImageSets' / 'Main' / 'test.txt'}: no objects to score (none, "
        "or only difficult/crowd ones) in the 1 evaluated images: mAP would be 0"
    )


def test_validate_in_a_fresh_process_prints_one_line(voc, tmp_path):
    root, ids = voc
    _edit_first_object(root, ids, xmin="inf")
    r = subprocess.run(
        [sys.executable, "-m", "lossscale_bench.cli", "validate", _study_file(tmp_path, _voc_dataset(root))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "a coordinate is not finite" in _one_error_line(r.stderr)


def test_an_unknown_policy_is_refused_with_the_allowed_ones(voc, tmp_path, capsys):
    root, _ = voc
    code, _, err = _lsbench(capsys, "validate", _study_file(tmp_path, _voc_dataset(root, ", bad_annotations: dorp")))
    line = _one_error_line(err)
    assert code == 2 and "dataset.bad_annotations" in line and "did you mean 'drop'" in line and "error, drop" in line


# --------------------------------------------------------------------------- COCO


@pytest.fixture()
def coco(tmp_path):
    """A COCO-2017-layout folder made from the synthetic set."""
    return coco_from_synthetic(tmp_path, train_images=6, val_images=3, seed=7)[0]


def _rewrite(path, edit):
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


COCO_CASES = {  # edit of the evaluation json -> what the line must show after "<file>: "
    "images empty": (lambda d: d.update(images=[]), "images: is empty: nothing to score (mAP would be 0)"),
    "no annotations": (lambda d: d.pop("annotations"), "no 'annotations' list"),
    "no categories": (lambda d: d.pop("categories"), "no 'categories' list"),
    "annotations empty": (
        lambda d: d.update(annotations=[]),
        "no annotations (other than crowd) of its categories on its 3 images",
    ),
    "no bbox": (lambda d: d["annotations"][1].pop("bbox"), "annotations[1] (id 2, image 2): no 'bbox'"),
    "record not an object": (
        lambda d: d["annotations"].__setitem__(0, [1, 2]),
        "annotations[0]: [1, 2] is not an annotation record",
    ),
    "nan bbox": (
        lambda d: d["annotations"][0].update(bbox=[1, float("nan"), 5, 5]),
        "annotations[0] (id 1, image 1): bbox [1, NaN, 5, 5] has a non-finite number",
    ),
    "unknown category": (
        lambda d: d["annotations"][0].update(category_id=99),
        "annotations[0] (id 1, image 1): category_id 99 is not in categories (ids 1, 2, 3)",
    ),
    "image without file_name": (lambda d: d["images"][2].pop("file_name"), "images[2] (id 3): no 'file_name'"),
    "category without id": (
        lambda d: d["categories"][0].pop("id"),
        'categories[0]: {"name": "rectangle", '
        '"supercategory": "shape"} is not a category '
        "with an integer 'id' and a 'name'",
    ),
}


@pytest.mark.parametrize("case", sorted(COCO_CASES))
def test_a_broken_coco_evaluation_file_is_one_line_naming_file_and_record(coco, tmp_path, capsys, case):
    edit, shown = COCO_CASES[case]
    ann = coco / "annotations" / "instances_val2017.json"
    _rewrite(ann, edit)
    f = _study_file(tmp_path, f"{{name: coco2017, root: {coco}}}", "{metric: coco}")
    code, _, err = _lsbench(capsys, "validate", f)
    line = _one_error_line(err)
    assert code == 2 and f"{ann}: {shown}" in line, line


def test_coco_json_syntax_error_names_line_and_column(coco, tmp_path, capsys):
    ann = coco / "annotations" / "instances_val2017.json"
    ann.write_text(ann.read_text()[:-40])
    code, _, err = _lsbench(capsys, "validate", _study_file(tmp_path, f"{{name: coco2017, root: {coco}}}"))
    line = _one_error_line(err)
    assert code == 2 and re.search(re.escape(str(ann)) + r": line 1, column \d+: not valid JSON: ", line), line


@pytest.mark.parametrize("case", ["no bbox", "record not an object", "no categories"])
def test_the_training_file_is_checked_by_the_loader_naming_file_and_record(coco, case):
    """The training JSON (0.45 GB for COCO) is not parsed at validate; the loader says the same line."""
    edit, shown = COCO_CASES[case]
    ann = coco / "annotations" / "instances_train2017.json"
    _rewrite(ann, edit)
    with pytest.raises(AnnotationError) as e:
        build_datasets({"name": "coco2017", "root": str(coco)}, image_size=64)
    image = json.loads(ann.read_text())["annotations"][1].get("image_id") if case == "no bbox" else None
    assert str(e.value).startswith(f"{ann}: {shown.replace('image 2', f'image {image}')}"), str(e.value)
    assert "\n" not in str(e.value)


def test_coco_drop_keeps_dropped_records_out_of_what_pycocotools_scores(coco):
    ann = coco / "annotations" / "instances_val2017.json"
    _rewrite(ann, lambda d: d["annotations"][0].update(bbox=[900, 900, 5, 5]))
    _, val, _ = build_datasets({"name": "coco2017", "root": str(coco), "bad_annotations": "drop"}, image_size=64)
    assert val.dropped_annotations == {"outside_image": 1}
    assert 1 not in {a["id"] for a in val.coco.dataset["annotations"]}
    assert len(val.coco.dataset["annotations"]) == len(json.loads(ann.read_text())["annotations"]) - 1
