"""What a VOC split list names is checked before training: an image that is not there is one line
naming the list, the line and the id (it passed ``validate`` and failed the trial after training had
started); a byte-order mark at the start of a list is not part of the first id."""

from __future__ import annotations

from helpers import lsbench, tiny_data_study
from lossscale_bench.data.voc import make_tiny_voc
from lossscale_bench.dataset_files.voc_layout import read_split_ids


def _voc(tmp_path):
    root = tmp_path / "voc"
    ids = make_tiny_voc(root, {"trainval": 4, "test": 2}, seed=1)
    (tmp_path / "s.yaml").write_text(tiny_data_study(f"{{name: voc, root: {root}, classes: [square, disc]}}"))
    return root, ids


def test_a_missing_image_is_refused_before_training_naming_list_line_and_id(tmp_path):
    root, ids = _voc(tmp_path)
    gone = ids["test"][1]
    (root / "JPEGImages" / f"{gone}.jpg").unlink()
    listing = root / "ImageSets" / "Main" / "test.txt"
    for cmd in (["validate", "s.yaml"], ["run", "s.yaml", "--runs-dir", "runs", "--executor", "local"]):
        r = lsbench(*cmd, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (cmd, r.returncode, r.stdout[-1500:], r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line == (
            f"lsbench: error: s.yaml: dataset.val_split: {listing} line 2 lists {gone!r}, but its image "
            f"is not there: {root / 'JPEGImages' / gone}.jpg"
        ), line
    assert not (tmp_path / "runs" / "mlflow.db").exists()


def test_a_byte_order_mark_is_not_part_of_the_first_id(tmp_path):
    root, ids = _voc(tmp_path)
    listing = root / "ImageSets" / "Main" / "test.txt"
    listing.write_bytes(b"\xef\xbb\xbf" + listing.read_bytes())  # an editor's UTF-8 signature
    assert read_split_ids(listing) == ids["test"]
    r = lsbench("validate", "s.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_lsbench_version():
    from lossscale_bench import __version__

    r = lsbench("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"lsbench {__version__}", (r.stdout, r.stderr)
