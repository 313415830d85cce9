"""Hostile study files and paths: every case ends in one line, exit 2, fast.

Each test is one case that went wrong before: a billion-laughs file grew memory without limit, a
recursive anchor or 5,000-deep nesting was a RecursionError traceback, a 40,000-trial grid was
accepted silently, ``validate a b c`` stopped at the first bad file, and a missing weights file was
only found by every trial failing after Ray had started. The CLI runs in a subprocess, as a user
runs it; the billion-laughs one under an address-space limit, so a regression fails the test
instead of swapping the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lossscale_bench.study import StudyError, load_study, load_study_text
from lossscale_bench.study.load import MAX_GRID_TRIALS, grid_size
from lossscale_bench.study.paths import path_problems
from lossscale_bench.study.yaml_text import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES

REPO = Path(__file__).resolve().parents[2]

BASE = """\
name: hostile
dataset: {name: synthetic}
model: [ssd_tiny]
batch_size: [2]
precision: fp32
scaling: [{method: none}]
schedule: {iterations: 2, lr: 0.01}
"""


def _cli(*args, cwd=None, mem_bytes=None, timeout=60):
    """``lsbench ARGS`` in a fresh interpreter; with ``mem_bytes``, under RLIMIT_AS (virtual memory)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "lossscale_bench.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        preexec_fn=limit if mem_bytes else None,
    )
    r.seconds = time.monotonic() - t0
    return r


def _one_line_exit_2(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("lsbench: error: "), err[-2000:]
    assert "Traceback" not in err
    for n in needles:
        assert str(n) in err, (n, err)
    return err


def _write(tmp_path: Path, text: str, name: str = "study.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _laughs(levels: int = 9) -> str:
    """The classic: nine anchors, each ten aliases of the previous: 10**9 strings once expanded."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- YAML bombs


def test_billion_laughs_fails_fast_in_bounded_memory(tmp_path):
    f = _write(tmp_path, _laughs() + BASE + "description: *l9\n")
    # an interpreter with pydantic and PyYAML needs well under 1 GiB of address space; the expanded
    # document (10**9 strings) would need hundreds of GiB
    r = _cli("validate", f, cwd=tmp_path, mem_bytes=1024**3, timeout=60)
    err = _one_line_exit_2(r, f, "line ", f"more than {MAX_NODES} values", "alias *l")
    assert r.seconds < 10, (r.seconds, err)


def test_billion_laughs_in_process_allocates_little():
    import tracemalloc

    tracemalloc.start()
    t0 = time.monotonic()
    with pytest.raises(StudyError, match=r"more than 100000 values once aliases are expanded"):
        load_study_text(_laughs() + BASE + "description: *l9\n", "bomb.yaml")
    seconds = time.monotonic() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert seconds < 5 and peak < 64 * 1024**2, (seconds, peak)


def test_aliases_that_stay_small_are_fine():
    """Anchors, aliases and merge keys are ordinary YAML: only their expanded size is bounded."""
    text = BASE.replace("scaling: [{method: none}]\n", "").replace(
        "schedule: {iterations: 2, lr: 0.01}", "schedule: &sched {iterations: 4, lr: 0.01}"
    )
    text += (
        "scaling:\n  - &fixed {method: fixed, scale: 8, label: eight}\n"
        "  - {<<: *fixed, scale: 16, label: sixteen}\ndescription: &d [*sched, *sched]\n"
    )
    with pytest.raises(StudyError, match="description: expected a string"):
        load_study_text(text)  # the aliases were expanded: the schema sees the list
    study = load_study_text(text.replace("description: &d [*sched, *sched]", "description: &d two schedules"))
    assert [e.scale for e in study.scaling] == [8, 16] and study.schedule.iterations == 4


def test_recursive_anchor_is_one_line(tmp_path):
    f = _write(tmp_path, BASE + "seeds: &s [0, *s]\n")
    with pytest.raises(StudyError, match=r"study\.yaml: line 8, column \d+: ") as e:
        load_study(f)
    assert "line 8" in str(e.value) and "*s" in str(e.value) and "recursive" in str(e.value)
    _one_line_exit_2(_cli("validate", f, cwd=tmp_path), f, "alias *s is used inside its own anchor &s")


def test_recursive_merge_key_is_one_line(tmp_path):
    f = _write(tmp_path, BASE + "resources: &r {<<: *r}\n")
    _one_line_exit_2(_cli("run", f, "--dry-run", cwd=tmp_path), f, "recursive")


@pytest.mark.parametrize("open_, close", [("[", "]"), ("{a: ", "}")])
def test_5000_deep_nesting_is_one_line(tmp_path, open_, close):
    f = _write(tmp_path, BASE + "description: " + open_ * 5000 + "0" + close * 5000 + "\n")
    err = _one_line_exit_2(_cli("validate", f, cwd=tmp_path), f, f"nesting deeper than {MAX_DEPTH} levels")
    assert "line 8" in err


def test_depth_counts_through_aliases():
    """Each anchor wraps the previous one 30 deep: only 30 levels in the text, 300 once expanded."""
    lines = ["d0: &d0 0"]
    for i in range(1, 11):
        lines.append(f"d{i}: &d{i} " + "[" * 30 + f"*d{i - 1}" + "]" * 30)
    with pytest.raises(StudyError, match=rf"nesting deeper than {MAX_DEPTH} levels \(through alias \*d2\)"):
        load_study_text("\n".join(lines) + "\n" + BASE)


def test_nesting_up_to_the_limit_reaches_the_schema():
    """63 levels inside the top mapping (64 in all) parse; the schema then says what is wrong."""
    deep = "[" * (MAX_DEPTH - 2) + "1" + "]" * (MAX_DEPTH - 2)
    with pytest.raises(StudyError, match=r"^<string>: description: expected a string"):
        load_study_text(BASE + f"description: {deep}\n")
    with pytest.raises(StudyError, match="nesting deeper"):
        load_study_text(BASE + f"description: [{deep}]\n")


def test_file_size_is_bounded(tmp_path):
    pad = MAX_FILE_BYTES - len(BASE.encode()) - len("description: \n")
    ok = _write(tmp_path, BASE + "description: " + "x" * pad + "\n", "ok.yaml")
    assert ok.stat().st_size == MAX_FILE_BYTES
    assert load_study(ok).description == "x" * pad
    big = _write(tmp_path, BASE + "description: " + "x" * (pad + 1) + "\n", "big.yaml")
    _one_line_exit_2(
        _cli("validate", big, cwd=tmp_path), big, "too large for a study file", f"at most {MAX_FILE_BYTES} bytes"
    )
    with pytest.raises(StudyError, match="too large"):
        load_study_text(big.read_text(), "big.yaml")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_an_endless_file_is_not_read_forever(tmp_path):
    r = _cli("validate", "/dev/zero", cwd=tmp_path, mem_bytes=1024**3, timeout=60)
    _one_line_exit_2(r, "/dev/zero", "too large")


# --------------------------------------------------------------------------- grid size


def test_20000_seed_grid_needs_the_flag(tmp_path):
    text = BASE.replace("[{method: none}]", "[none, adaptive]") + "seeds: [" + ", ".join(map(str, range(20000))) + "]\n"
    f = _write(tmp_path, text)
    for cmd in (["validate", f], ["run", f, "--dry-run"], ["run", f]):
        r = _cli(*cmd, cwd=tmp_path)
        _one_line_exit_2(r, f, "40000 trials", "20000 seeds", f"more than {MAX_GRID_TRIALS}", "--allow-large-grid")
        assert "allow_large_grid" not in r.stderr  # the Python keyword is no command-line option
        assert r.seconds < 30
    assert not (tmp_path / "runs").exists()  # nothing started


def test_the_grid_limit_is_on_trials_and_the_flag_lifts_it(tmp_path):
    at = _write(tmp_path, BASE + f"seeds: [{', '.join(map(str, range(MAX_GRID_TRIALS)))}]\n", "at.yaml")
    over = _write(tmp_path, BASE + f"seeds: [{', '.join(map(str, range(MAX_GRID_TRIALS + 1)))}]\n", "over.yaml")
    assert len(load_study(at).trials()) == MAX_GRID_TRIALS
    with pytest.raises(StudyError, match=f"{MAX_GRID_TRIALS + 1} trials"):
        load_study(over)
    r = _cli("run", over, "--dry-run", "--allow-large-grid", cwd=tmp_path)
    assert r.returncode == 0 and f"{MAX_GRID_TRIALS + 1} trials" in r.stdout, r.stderr


def test_grid_size_counts_what_expand_builds():
    """An entry whose overrides pin the model and batch size makes one trial a seed, in the count as in the
    grid (entries that repeat each other, and repeated seeds, are refused: tests/study/test_every_problem.py)."""
    text = (
        BASE.replace("model: [ssd_tiny]", "model: [ssd_tiny, ssd300_vgg16]")
        .replace("batch_size: [2]", "batch_size: [2, 4]")
        .replace(
            "[{method: none}]",
            "[{method: none, model: ssd_tiny, batch_size: 2, label: pinned}, adaptive, {method: fixed, scale: 8}]",
        )
    )
    study = load_study_text(text + "seeds: [0, 1]\n")
    assert grid_size(study) == len(study.trials()) == (1 + 4 + 4) * 2
    for f in sorted((REPO / "studies").glob("*.yaml")) + [REPO / "lossscale_bench" / "studies" / "smoke.yaml"]:
        study = load_study(f)
        assert grid_size(study) == len(study.trials()), f


# --------------------------------------------------------------------------- validate: every file, every path


def test_validate_checks_every_file(tmp_path):
    a = _write(tmp_path, BASE.replace("fp32", "fp33"), "a.yaml")
    b = _write(tmp_path, BASE, "b.yaml")
    c = _write(tmp_path, BASE + "seeds: &s [*s]\n", "c.yaml")
    r = _cli("validate", a, b, c, tmp_path / "absent.yaml", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    errs = r.stderr.strip().splitlines()
    assert len(errs) == 3 and all(e.startswith("lsbench: error: ") for e in errs), errs
    assert str(a) in errs[0] and "precision" in errs[0]
    assert str(c) in errs[1] and "recursive" in errs[1]
    assert "absent.yaml" in errs[2] and "file not found" in errs[2]
    assert f"{b}: ok, study 'hostile'" in r.stdout and "1 trials" in r.stdout
    assert "Traceback" not in r.stderr


def test_validate_names_missing_weights_and_data(tmp_path):
    text = (
        BASE.replace("{name: synthetic}", "{name: coco2017, root: coco}")
        + "model_options: {backbone_weights: weights/vgg16.pth}\n"
    )
    f = _write(tmp_path, text)
    r = _cli("validate", f, cwd=tmp_path)
    assert r.returncode == 2 and "ok" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert lines[0] == (
        f"lsbench: error: {f}: dataset.root: not found: {tmp_path / 'coco'} "
        f"(fetch it with: lsbench data coco --root {tmp_path / 'coco'})"
    )
    assert (
        lines[1] == f"lsbench: error: {f}: model_options.backbone_weights: file not found: "
        f"{tmp_path / 'weights' / 'vgg16.pth'}"
    )
    assert "--schema-only" in lines[2] and len(lines) == 3
    r = _cli("validate", "--schema-only", f, cwd=tmp_path)
    assert r.returncode == 0 and "ok (schema only: paths not checked)" in r.stdout, r.stderr
    # present, it passes
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "vgg16.pth").write_bytes(b"x")
    for rel in ("train2017", "val2017", "annotations"):
        (tmp_path / "coco" / rel).mkdir(parents=True)
    (tmp_path / "coco" / "annotations" / "instances_train2017.json").write_text("{}")  # read by the trial
    (tmp_path / "coco" / "annotations" / "instances_val2017.json").write_text(  # read here: must hold objects
        '{"images": [{"id": 1, "file_name": "1.jpg", "width": 9, "height": 9}], "categories": [{"id": 1, '
        '"name": "a"}], "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "area": 25}]}'
    )
    r = _cli("validate", f, cwd=tmp_path)
    assert r.returncode == 0 and f"{f}: ok, study" in r.stdout, r.stderr


def test_coco_root_that_is_not_coco(tmp_path):
    (tmp_path / "coco" / "train2017").mkdir(parents=True)
    study = load_study(_write(tmp_path, BASE.replace("{name: synthetic}", "{name: coco2017, root: coco}")))
    problems = [str(p) for p in path_problems(study)]
    assert len(problems) == 3, problems
    assert all("dataset.root: " in p and "does not look like a coco2017 dataset" in p for p in problems)
    assert "instances_train2017.json" in problems[0] and problems[2].endswith(
        f"folder not found: {tmp_path / 'coco' / 'val2017'} (fetch it with: lsbench data coco --root "
        f"{tmp_path / 'coco'})"
    )
    # fake_data never reads the root; synthetic data is generated on first use
    assert path_problems(load_study_text(BASE.replace("{name: synthetic}", "{name: coco2017, fake_data: true}"))) == []
    assert (
        path_problems(
            load_study_text(BASE.replace("{name: synthetic}", f"{{name: synthetic, root: {tmp_path / 'new'}}}"))
        )
        == []
    )


def test_voc_paths_agree_with_the_voc_loader(tmp_path):
    """The study layer's VOC check (os.path only) and data.voc.voc_required_paths name the same paths."""
    from lossscale_bench.data.voc import make_tiny_voc, voc_required_paths

    devkit = tmp_path / "VOCdevkit"
    make_tiny_voc(devkit / "VOC2007", {"trainval": 2, "test": 1}, classes=("cat", "dog"))  # VOC's own classes
    make_tiny_voc(devkit / "VOC2012", {"trainval": 2}, classes=("cat", "dog"))
    voc0712 = load_study_text(BASE.replace("{name: synthetic}", f"{{name: voc0712, root: {devkit}}}"))
    voc = load_study_text(
        BASE.replace(
            "{name: synthetic}",
            f"{{name: voc, root: {devkit / 'VOC2012'}, classes: [cat, dog], train_split: train+val, val_split: val}}",
        )
    )
    assert path_problems(voc0712) == [] and path_problems(voc) == []
    for study, victim in (
        (voc0712, devkit / "VOC2012" / "JPEGImages"),
        (voc0712, devkit / "VOC2007" / "ImageSets" / "Main" / "test.txt"),
        (voc, devkit / "VOC2012" / "ImageSets" / "Main" / "val.txt"),
    ):
        moved = victim.with_name(victim.name + ".away")
        victim.rename(moved)
        try:
            need = [str(p) for p in voc_required_paths(study.dataset.model_dump()) if not p.exists()]
            said = [str(p) for p in path_problems(study)]
            assert need == [str(victim)] and len(said) == 1, (need, said)
            assert said[0].endswith(
                f"not found: {victim}"
                + (
                    f" (fetch it with: lsbench data voc --root {tmp_path})"
                    if study is voc0712
                    else " (a VOC-format folder needs Annotations/, JPEGImages/ and ImageSets/Main/<split>.txt)"
                )
            )
            assert "does not look like a" in said[0]
        finally:
            moved.rename(victim)


def test_every_shipped_study_validates_schema_only():
    files = sorted((REPO / "studies").glob("*.yaml")) + [REPO / "lossscale_bench" / "studies" / "smoke.yaml"]
    r = _cli("validate", "--schema-only", *files)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("ok (schema only") == len(files)
    # the synthetic ones name no path that must exist: they validate fully here
    r = _cli("validate", REPO / "studies" / "smoke.yaml", REPO / "lossscale_bench" / "studies" / "smoke.yaml")
    assert r.returncode == 0, r.stderr


def test_run_refuses_missing_weights_before_anything_starts(tmp_path):
    f = _write(tmp_path, BASE + "model_options: {backbone_weights: nowhere/tiny.pth}\n")
    r = _cli("run", f, "--runs-dir", tmp_path / "runs", cwd=tmp_path, timeout=120)
    _one_line_exit_2(r, f, "model_options.backbone_weights: file not found", tmp_path / "nowhere" / "tiny.pth")
    assert not (tmp_path / "runs").exists()
    assert r.seconds < 30  # no Ray, no store, no trial


def test_run_names_how_many_more_paths_are_missing(tmp_path):
    text = (
        BASE.replace("{name: synthetic}", "{name: voc0712, root: data/VOCdevkit}")
        + "model_options: {backbone_weights: w.pth}\n"
    )
    f = _write(tmp_path, text)
    r = _cli("run", f, "--runs-dir", tmp_path / "runs", cwd=tmp_path, timeout=120)
    _one_line_exit_2(
        r,
        f,
        "dataset.root: not found",
        "lsbench data voc --root " + str(tmp_path / "data"),
        "(and 1 more missing path: lsbench validate",
    )
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- duplicate labels


@pytest.mark.parametrize(
    "scaling, where, label",
    [
        (
            "[{method: fixed, scale: 8, label: mine}, adaptive, {method: fixed, scale: 16, label: mine}]",
            "scaling[2].label",
            "mine",
        ),
        # defaults: at mixed16 `none` and `fixed, scale: 1` both read "no loss scale"
        ("[none, adaptive, {method: fixed, scale: 1}]", "scaling[2]", "no loss scale"),
        ("[{method: adaptive, label: A}, {method: dynamic, label: A, batch_size: 2}]", "scaling[1].label", "A"),
    ],
)
def test_duplicate_labels_are_refused(tmp_path, scaling, where, label):
    f = _write(tmp_path, BASE.replace("precision: fp32", "precision: mixed16").replace("[{method: none}]", scaling))
    _one_line_exit_2(
        _cli("validate", "--schema-only", f, cwd=tmp_path),
        f,
        f"{where}: ",
        f"label {label!r} is also scaling[0]'s",
        "ssd_tiny batch 2 mixed16",
        "'label:'",
    )


@pytest.mark.parametrize(
    "scaling",
    [
        "[{method: none, precision: fp32, label: L}, {method: adaptive, label: L}]",  # precision tells them apart
        "[{method: adaptive, label: L}, {method: adaptive, label: L, batch_size: 4}]",  # another table
        "[{method: adaptive, label: L}, {method: adaptive, label: L, model: ssd300_vgg16}]",
    ],
)
def test_labels_that_the_report_can_tell_apart_are_fine(scaling):
    load_study_text(BASE.replace("precision: fp32", "precision: mixed16").replace("[{method: none}]", scaling))
