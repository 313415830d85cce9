"""``lsbench run`` exit codes (README "Exit codes"): 3 when a trial failed, with the report still
printed; 0 when every trial finished or diverged (divergence is a result). A study whose
every trial failed (corrupt JPEG, bad annotation XML) used to exit 0.

``--executor local`` keeps these fast: the code is decided from the outcomes, whichever executor
produced them (tests/orchestration/test_signals.py runs the Ray path).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CLI = [sys.executable, "-m", "lossscale_bench.cli"]

VOC_STUDY = textwrap.dedent("""\
    name: bad_{kind}
    dataset: {{name: voc, root: {root}, classes: [square, disc]}}
    model: ssd_tiny
    model_options: {{width: 8, image_size: 64}}
    batch_size: 2
    precision: fp32
    scaling: [{{method: none}}, {{method: fixed, scale: 8}}]
    schedule: {{iterations: 2, lr: 1.0e-3}}
    eval: {{metric: voc07}}
    """)


def _run(tmp_path, study: Path, *extra):
    return subprocess.run(
        CLI
        + [
            "run",
            str(study),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--executor",
            "local",
            "--reports-dir",
            str(tmp_path / "reports"),
            *extra,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _break(kind: str, root: Path) -> None:
    if kind == "jpeg":
        for f in (root / "JPEGImages").iterdir():
            f.write_bytes(b"\xff\xd8\xff\xe0 not the rest of a JPEG")
    else:
        for f in (root / "Annotations").iterdir():
            f.write_text("<annotation><object><name>square</name><bndbox><xmin>1</xmin>")  # cut off


def test_a_broken_annotation_is_a_user_error_before_any_trial(tmp_path):
    """`run` reads the annotations before training (was: every trial failed, exit 3)."""
    from lossscale_bench.data.voc import make_tiny_voc

    root = tmp_path / "voc"
    make_tiny_voc(root, {"trainval": 4, "test": 2}, seed=1)
    _break("xml", root)
    study = tmp_path / "s.yaml"
    study.write_text(VOC_STUDY.format(kind="xml", root=root))
    r = _run(tmp_path, study)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"lsbench: error: {study}: dataset: {root / 'Annotations'}/") and "not valid XML" in line
    assert not (tmp_path / "runs" / "mlflow.db").exists()


def test_an_image_that_cannot_be_opened_is_a_user_error_before_any_trial(tmp_path):
    """`run` opens every listed image's header before training (was: every trial failed, exit 3)."""
    from lossscale_bench.data.voc import make_tiny_voc

    root = tmp_path / "voc"
    make_tiny_voc(root, {"trainval": 4, "test": 2}, seed=1)
    _break("jpeg", root)
    study = tmp_path / "s.yaml"
    study.write_text(VOC_STUDY.format(kind="jpeg", root=root))
    r = _run(tmp_path, study)
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    (line,) = r.stderr.strip().splitlines()
    assert f"{study}: dataset.train_split: {root / 'ImageSets/Main/trainval.txt'} line 1 lists" in line, line
    assert "but its image cannot be opened:" in line, line
    assert not (tmp_path / "runs" / "mlflow.db").exists()


def test_every_trial_failed_exits_3_with_the_report(tmp_path):
    """Every trial fails (its folder cannot be made: the runs folder holds a file where the trials go)."""
    from lossscale_bench.data.voc import make_tiny_voc

    root = tmp_path / "voc"
    make_tiny_voc(root, {"trainval": 4, "test": 2}, seed=1)
    (tmp_path / "runs" / "bad_trials").mkdir(parents=True)
    (tmp_path / "runs" / "bad_trials" / "trials").write_text("in the way\n")
    study = tmp_path / "s.yaml"
    study.write_text(VOC_STUDY.format(kind="trials", root=root))
    r = _run(tmp_path, study)
    assert r.returncode == 3, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "study bad_trials: 0 finished, 0 diverged, 2 failed" in r.stdout
    assert "(written to" in r.stdout  # the report is printed all the same
    assert "Traceback" not in r.stderr


def test_diverged_is_a_result_not_a_failure_exit_0(tmp_path):
    study = tmp_path / "s.yaml"
    study.write_text(
        textwrap.dedent("""\
        name: blowup
        dataset: {name: synthetic, train_images: 8, val_images: 4, image_size: 64, seed: 0}
        model: ssd_tiny
        model_options: {width: 8}
        batch_size: 4
        precision: fp16-emulated
        scaling:
          - {method: fixed, scale: 1.0e+30, skip_nonfinite: false}
          - {method: fixed, scale: 128}
        schedule: {iterations: 8, lr: 0.01, warmup_iterations: 2}
        divergence: {patience: 3}
        """)
    )
    r = _run(tmp_path, study, "--no-report")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "study blowup: 1 finished, 1 diverged, 0 failed" in r.stdout


def test_validate_into_a_closed_pipe_exits_141_without_a_traceback(tmp_path):
    """``lsbench validate ... | head -1``: the reader leaves after one line; no BrokenPipeError traceback."""
    studies = sorted(str(p) for p in (Path(__file__).parent.parent / "studies").glob("*.yaml"))
    proc = subprocess.Popen(
        CLI + ["validate", "--schema-only", *studies, *studies],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away while validate still has tables to print
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err.decode() and "BrokenPipeError" not in err.decode()
    assert proc.returncode == 141
