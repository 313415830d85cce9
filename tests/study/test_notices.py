"""Valid studies that may not mean what they say get a note (stderr), not an error."""

from __future__ import annotations

from helpers import study_yaml
from lossscale_bench.study import load_study_text


def _load(**overrides):
    return load_study_text(study_yaml(**overrides), "s.yaml")


def test_a_loss_scale_where_gradients_have_fp32_range_is_accepted_with_a_note():
    from lossscale_bench.study.notices import study_notices

    s = _load(
        precision="bf16",
        scaling=[
            "none",
            "{method: fixed, scale: 128}",
            "{method: adaptive, precision: fp32}",
            "{method: dynamic, precision: fp16-emulated}",
        ],
    )
    notes = study_notices(s)
    assert len(notes) == 2
    assert notes[0].startswith("s.yaml: scaling[1] (fixed) in bf16: bf16 gradients")
    assert notes[1].startswith("s.yaml: scaling[2] (adaptive) in fp32: fp32 gradients")
    assert study_notices(_load(precision="fp16-emulated", scaling=["{method: fixed, scale: 8}"])) == []


def test_validate_says_it_on_stderr_and_a_dry_run_on_stdout(tmp_path):
    from helpers import lsbench

    f = tmp_path / "s.yaml"
    f.write_text(study_yaml(precision="bf16", scaling=["{method: fixed, scale: 128}"]))
    r = lsbench("validate", f)
    assert r.returncode == 0 and "lsbench: note: " in r.stderr and "scaling[0] (fixed) in bf16" in r.stderr
    r = lsbench("run", f, "--dry-run")
    assert r.returncode == 0 and "scaling[0] (fixed) in bf16" in r.stdout and r.stderr.strip() == ""


def test_evaluation_images_that_are_also_training_images_get_a_note(tmp_path):
    """Scoring the training images is a check of fit, not a validation score: accepted, with a note."""
    from lossscale_bench.data.voc import make_tiny_voc
    from lossscale_bench.study.notices import study_notices

    ids = make_tiny_voc(tmp_path / "voc", {"trainval": 4, "test": 2})  # val.txt: the second half of trainval

    def notes(train, val):
        ds = f"{{name: voc, root: {tmp_path / 'voc'}, classes: [square, disc], train_split: {train}, val_split: {val}}}"
        return study_notices(_load(dataset=ds))

    (note,) = notes("trainval", "val")
    val_list = tmp_path / "voc" / "ImageSets" / "Main" / "val.txt"
    assert note.startswith(
        f"s.yaml: dataset.val_split: 2 of its 2 images are also training images ({ids['trainval'][2]!r}"
    )
    assert str(val_list) in note and "not a validation score" in note
    assert notes("train", "val") == [] and notes("trainval", "test") == []
    (note,) = notes("trainval", "test+val")  # a joined split: the shared part counted
    assert "2 of its 4 images" in note
    assert notes("trainval", "nowhere") == []  # a list that is not there: the path check names it
