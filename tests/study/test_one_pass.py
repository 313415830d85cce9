"""``lsbench validate`` names every problem of a file in one pass (study/partial.py): the field errors,
the checks across fields, the grid's repeats and the data's own problems together (it used to take
three runs: the field errors, then the cross-field ones, then the data), and nothing that is only an
effect of a key already reported. A model or batch size listed twice is refused like a seed."""

from __future__ import annotations

import pytest

from helpers import lsbench
from lossscale_bench.study import StudyError, load_study_text

LAYERS = """\
name: onepass
dataset: {name: voc, root: voc, classes: [square], train_split: trainval, val_split: test}
model: ssd_tiny
batch_size: [4]
precision: fp32
scaling:
  - {method: none, baseline: true}
  - {method: fixed, scale: 128, baseline: true}
seeds: [0, 1, 1]
schedule: {iterations: 10, lr: 0.01, warmup_iterations: 20, momentum: 2}
eval: {every: 0, metric: coco}
log_every: -1
colour: blue
"""

FIELDS = [
    "schedule.momentum: 2 is out of range",
    "eval.every: 0 is out of range",
    "log_every: -1 is out of range",
    "colour: unknown key",
]
ACROSS = [
    "schedule.warmup_iterations: 20 must be < schedule.iterations (10)",
    "scaling[1].baseline: scaling[0] is already the baseline",
]
REPEATS = ["seeds[2]: seed 1 is already seeds[1]"]
DATA = ["dataset: ", "class 'disc' is not in dataset.classes ['square']"]


def test_validate_names_the_field_cross_field_repeat_and_data_problems_in_one_run(tmp_path):
    from lossscale_bench.data.voc import make_tiny_voc

    make_tiny_voc(tmp_path / "voc", {"trainval": 4, "test": 4})  # its objects are squares and discs
    (tmp_path / "s.yaml").write_text(LAYERS)
    r = lsbench("validate", "s.yaml", cwd=tmp_path, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and all(ln.startswith("lsbench: error: s.yaml: ") for ln in lines), r.stderr
    assert "Traceback" not in r.stderr
    wanted = [*FIELDS, *ACROSS, *REPEATS, " ".join(DATA)]
    assert len(lines) == len(wanted), lines
    for want, line in zip(wanted, lines):
        assert all(part in line for part in want.split(" class ")), (want, line)
    # fixed, the file is ok: nothing was a consequence of another line
    fixed = (
        LAYERS.replace(", baseline: true}\nseeds", "}\nseeds")
        .replace("[0, 1, 1]", "[0, 1]")
        .replace("warmup_iterations: 20, momentum: 2", "warmup_iterations: 2")
        .replace("every: 0", "every: 5")
        .replace("log_every: -1", "log_every: 1")
        .replace("colour: blue\n", "")
        .replace("classes: [square]", "classes: [square, disc]")
    )
    (tmp_path / "s.yaml").write_text(fixed)
    r = lsbench("validate", "s.yaml", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr


def _problems(text: str) -> list[str]:
    with pytest.raises(StudyError) as err:
        load_study_text(text, "s.yaml")
    return [str(p).removeprefix("s.yaml: ") for p in err.value.problems]


BASE = LAYERS.replace("root: voc", "root: /nowhere").replace("seeds: [0, 1, 1]", "seeds: [0, 1]")


def test_a_problem_that_only_follows_from_a_key_already_reported_is_not_reported():
    # scaling[1]'s scale is wrong; without it the entry would say nothing more about itself
    text = BASE.replace("scale: 128, baseline: true", "scale: -1")
    got = _problems(text)
    assert [p.split(":")[0] for p in got] == [
        "scaling[1].scale",
        "schedule.momentum",
        "eval.every",
        "log_every",
        "colour",
        "schedule.warmup_iterations",
    ], got
    # a required key that is wrong stops the checks that need it: no guess from a stand-in
    text = BASE.replace("precision: fp32", "precision: fp33")
    got = _problems(text)
    assert got[0].startswith("precision: unknown precision 'fp33'") or got[0].startswith("precision:"), got
    assert not any(p.startswith(("schedule.warmup_iterations", "scaling[1].baseline")) for p in got), got


@pytest.mark.parametrize(
    "axis,text,line",
    [
        ("model", "model: [ssd_tiny, ssd_tiny]", "model[1]: model 'ssd_tiny' is already model[0]"),
        ("batch_size", "batch_size: [4, 8, 4]", "batch_size[2]: batch size 4 is already batch_size[0]"),
    ],
)
def test_a_model_or_batch_size_listed_twice_is_refused_like_a_seed(axis, text, line):
    study = BASE.replace("warmup_iterations: 20, momentum: 2", "warmup_iterations: 2").replace(
        "  - {method: fixed, scale: 128, baseline: true}\n", "  - {method: fixed, scale: 128}\n"
    )
    study = "\n".join(ln for ln in study.splitlines() if not ln.startswith(("eval:", "log_every:", "colour:")))
    study = study.replace("model: ssd_tiny" if axis == "model" else "batch_size: [4]", text) + "\n"
    got = _problems(study)
    assert got == [
        f"{line}; a {axis.replace('_', ' ')} listed twice would run once; allowed: each {axis.replace('_', ' ')} once"
    ], got
