"""The CLI's contract: one-line errors with exit code 2, never a traceback; dry runs print the grid."""

from __future__ import annotations

import pytest

from helpers import AS_USER, MODES_OBEYED, lsbench, write_study


def _run(*args, cwd=None):
    return lsbench(*args, cwd=cwd, timeout=120)


@pytest.mark.parametrize(
    "body, field",
    [
        ("name: x\nmodel: [ssd_huge]\n", "model"),
        ("name: x\nfoo: 1\n", "foo"),
        ("name: x\nscaling: [{method: fixed, scale: -1}]\n", "scaling[0].scale"),
        ("name: [unclosed\n", "line"),
    ],
)
def test_bad_study_is_one_line_exit_2(tmp_path, body, field):
    f = tmp_path / "bad.yaml"
    base = (
        "dataset: {name: synthetic}\nmodel: [ssd_tiny]\nbatch_size: [2]\nprecision: fp32\n"
        "scaling: [{method: none}]\nseeds: [0]\nschedule: {iterations: 2, lr: 0.01}\n"
    )
    text = body if body.startswith("name: [") else base + body.replace("name: x\n", "name: x\n", 1)
    # later keys override earlier ones only if they are different keys; rebuild without duplicates
    lines = {}
    for line in text.splitlines():
        lines[line.split(":", 1)[0]] = line
    f.write_text("\n".join(lines.values()) + "\n" if not body.startswith("name: [") else body)
    for cmd in (["validate", str(f)], ["run", str(f), "--dry-run"], ["run", str(f)]):
        r = _run(*cmd, cwd=tmp_path)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1, err
        assert "Traceback" not in err
        assert str(f) in err and field in err


def test_missing_file(tmp_path):
    r = _run("validate", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "nope.yaml" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_dry_run_of_the_embedded_study():
    r = _run("run", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "FP32 baseline" in r.stdout and "adaptive" in r.stdout and "27 trials" in r.stdout


def test_missing_data_fails_before_any_trial(tmp_path):
    f = tmp_path / "coco.yaml"
    f.write_text(
        "name: c\ndataset: {name: coco2017, root: %s}\nmodel: [ssd_tiny]\nbatch_size: [2]\n"
        "precision: fp32\nscaling: [{method: none}]\nseeds: [0]\nschedule: {iterations: 2, lr: 0.01}\n"
        % (tmp_path / "nowhere")
    )
    r = _run("run", str(f), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "nowhere" in r.stderr and "lsbench data coco" in r.stderr
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # refused before the store was touched
    assert not (tmp_path / "runs" / "c" / "trials").exists()


def test_unwritable_reports_dir_is_refused_before_any_trial(tmp_path):
    """Before: found only when the report was written, after every trial had trained."""
    f = write_study(tmp_path, schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 2})
    (tmp_path / "taken").write_text("a file")
    cases = [
        ("taken", "--reports-dir taken is a file, not a folder", ()),
        ("taken/sub", f"--reports-dir taken/sub cannot be created: {tmp_path / 'taken'} is a file, not a folder", ()),
    ]
    if MODES_OBEYED:
        (tmp_path / "ro").mkdir(mode=0o555)
        cases.append(
            ("ro/reports", f"--reports-dir ro/reports cannot be created: {tmp_path / 'ro'} is read-only", AS_USER)
        )
    for reports, needle, prefix in cases:
        r = lsbench(
            "run",
            f,
            "--executor",
            "local",
            "--runs-dir",
            tmp_path / "runs",
            "--reports-dir",
            reports,
            cwd=tmp_path,
            timeout=180,
            prefix=prefix,
        )
        assert r.returncode == 2, (reports, r.stdout[-1500:], r.stderr[-2000:])
        assert r.stderr.startswith(f"lsbench: error: {needle}") and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "pass a folder that can be written, or --no-report" in r.stderr
        assert not (tmp_path / "runs").exists()  # nothing trained, no store made


def test_a_misspelt_malloc_setting_is_refused_before_any_trial(tmp_path):
    """LSBENCH_MALLOC=sytem used to keep the default without a word."""
    f = write_study(tmp_path, schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 2})
    r = lsbench(
        "run",
        f,
        "--executor",
        "local",
        "--runs-dir",
        tmp_path / "runs",
        cwd=tmp_path,
        timeout=180,
        env={"LSBENCH_MALLOC": "sytem"},
    )
    assert r.returncode == 2, (r.stdout[-1500:], r.stderr[-2000:])
    assert r.stderr.strip() == (
        "lsbench: error: LSBENCH_MALLOC='sytem' in the environment: allowed: 'system' "
        "(glibc's malloc defaults) or 'kept' (freed memory kept, the default; also when unset)"
    )
    assert not (tmp_path / "runs").exists()  # nothing trained, no store made


@pytest.mark.parametrize("port", ["70000", "-1", "0"])
def test_ui_refuses_a_port_outside_1_to_65535_at_once(tmp_path, port):
    r = _run("ui", "--runs-dir", str(tmp_path / "runs"), f"--port={port}", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == f"lsbench: error: --port {port}: a TCP port is 1 to 65535"
    assert r.stdout == ""


def test_report_without_a_store(tmp_path):
    """No store there: one line, exit 2, and nothing created (tests/tracking/test_store_faults.py has the rest)."""
    r = _run("report", "--runs-dir", str(tmp_path / "runs"), "--study", "ghost", cwd=tmp_path)
    assert r.returncode == 2
    assert "no MLflow store at" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "study",
    sorted(p.name for p in (__import__("pathlib").Path(__file__).resolve().parents[1] / "studies").glob("*.yaml")),
)
def test_every_shipped_study_validates_and_dry_runs(study):
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "studies" / study
    r = _run("run", str(path), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "trials" in r.stdout


def test_mixed_backend_dry_run_shows_each_trials_placement():
    from pathlib import Path

    r = _run("run", str(Path(__file__).resolve().parents[1] / "studies" / "mixed_backends.yaml"), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "CPU:4, GPU:1" in r.stdout
    assert "CPU:0.25 + 8×{CPU:4, HPU:1}" in r.stdout
    assert "CPU:0.25 + 1×{CPU:4, TPU:8}" in r.stdout  # one TPU worker drives 8 chips (torch_xla.launch)


@pytest.mark.parametrize("margin", ["-1", "0", "abc", "nan", "inf", "1,0", "1e-300", "1e-7", "1e308", "100.5"])
def test_report_refuses_a_bad_margin_at_once(tmp_path, margin):
    """Refused before the store is opened: one line naming the flag and what it allows, exit 2. Outside
    [1e-6, 100] mAP points the statistics divided by zero (1e-300) or overflowed (1e308)."""
    r = _run("report", "--runs-dir", str(tmp_path / "runs"), f"--margin={margin}", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        f"lsbench: error: --margin {margin}: the equivalence margin is a number of mAP "
        "points from 1e-06 to 100 (e.g. 1.0)"
    )


def test_report_refuses_a_bad_margin_in_the_study_file_and_mixed_reports(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(
        "name: s\ndataset: synthetic\nmodel: ssd_tiny\nbatch_size: 8\nprecision: fp32\nscaling: [none]\n"
        "schedule: {iterations: 10, lr: 0.001}\nreport: {equivalence_margin: -0.5}\n"
    )
    r = _run("report", str(f), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert (
        str(f) in r.stderr
        and "report.equivalence_margin: -0.5 is out of range; allowed: numbers 1e-06 <= x <= 100" in r.stderr
    )
    f.write_text(f.read_text().replace("-0.5", "0.5"))
    r = _run("report", str(f), "--study", "other", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == f"lsbench: error: --study other: {f} is study 's'; give one or the other"
    r = _run("report", "--telemetry", "--compare", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "lsbench: error: --telemetry and --compare are two different reports; give one"
    assert not (tmp_path / "runs").exists()
