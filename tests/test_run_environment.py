"""What ``validate`` and ``run`` refuse in the environment before anything trains: one line for each
switch set to a value its reader would ignore or misread, exit 2, no library line."""

from __future__ import annotations

from helpers import library_lines, lsbench, study_yaml
from lossscale_bench.core.portable import PORTABLE_ENV

CLEAN = {k: "" for k in PORTABLE_ENV} | {"LSBENCH_NO_NATIVE": "", "LSBENCH_NO_COMPILE": "", "LSBENCH_MALLOC": ""}


def _errors(r) -> list[str]:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert not library_lines(r.stderr), r.stderr
    return r.stderr.strip().splitlines()


def test_upper_case_aten_capability_is_refused_with_its_own_reason(tmp_path):
    """torch compares ATEN_CPU_CAPABILITY case-sensitively and ignores ``AVX2`` (its UserWarning
    reached the terminal, then the trial failed naming three other causes): refused before training."""
    (tmp_path / "s.yaml").write_text(study_yaml(resources="{backend: cpu, repeatable: true}"))
    env = {**CLEAN, "ATEN_CPU_CAPABILITY": "AVX2"}
    for cmd in (["validate", "s.yaml"], ["run", "s.yaml", "--runs-dir", "runs", "--executor", "local", "--no-report"]):
        (line,) = _errors(lsbench(*cmd, cwd=tmp_path, env=env))
        assert (
            line.startswith("lsbench: error: resources.repeatable pins ATEN_CPU_CAPABILITY=avx2")
            and "lower case only and ignores 'AVX2'" in line
        ), line
    assert not (tmp_path / "runs").exists()


def test_the_pins_in_a_process_are_checked_as_torch_reads_them():
    import pytest

    from lossscale_bench.core.portable import PinConflict, pin, pin_problems, require_pinned

    assert pin_problems({**PORTABLE_ENV, "ONEDNN_MAX_CPU_ISA": "avx2"}) == []  # oneDNN takes either case
    with pytest.raises(PinConflict, match="lower case only"):
        pin({"ATEN_CPU_CAPABILITY": "AVX2"})
    with pytest.raises(RuntimeError, match="lower case only") as err:
        require_pinned({**PORTABLE_ENV, "ATEN_CPU_CAPABILITY": "AVX2"})
    assert "a CPU without AVX2" not in str(err.value)  # the one reason that applies, not three others


def test_validate_names_every_misread_switch_one_line_each(tmp_path):
    (tmp_path / "s.yaml").write_text(study_yaml(resources="{backend: cpu, repeatable: true}"))
    env = {**CLEAN, "LSBENCH_MALLOC": "sytem", "LSBENCH_NO_NATIVE": "nope", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    lines = _errors(lsbench("validate", "s.yaml", cwd=tmp_path, env=env))
    assert len(lines) == 3, lines
    assert lines[0].startswith("lsbench: error: LSBENCH_MALLOC='sytem' in the environment: allowed")
    assert lines[1].startswith("lsbench: error: LSBENCH_NO_NATIVE='nope' in the environment: allowed: 1, true")
    assert "pins ONEDNN_MAX_CPU_ISA=AVX2, but the environment sets ONEDNN_MAX_CPU_ISA=AVX512_CORE" in lines[2]
    # the same shell, the switches spelt as their readers take them: ok
    ok = {**CLEAN, "LSBENCH_MALLOC": "system", "LSBENCH_NO_NATIVE": "1", "LSBENCH_NO_COMPILE": "off"}
    r = lsbench("validate", "s.yaml", cwd=tmp_path, env=ok)
    assert r.returncode == 0, r.stderr


def test_run_refuses_a_misread_switch_before_training(tmp_path):
    (tmp_path / "s.yaml").write_text(study_yaml())
    r = lsbench(
        "run",
        "s.yaml",
        "--runs-dir",
        "runs",
        "--executor",
        "local",
        "--no-report",
        cwd=tmp_path,
        env={**CLEAN, "LSBENCH_NO_NATIVE": "nope"},
    )
    (line,) = _errors(r)
    assert line.startswith("lsbench: error: LSBENCH_NO_NATIVE='nope'"), line
    assert not (tmp_path / "runs").exists()
