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


# -- every variable parsed in one place (core/env_vars.py), lazily, one line each ------------------------------
def test_a_bad_number_is_one_line_for_validate_and_run_before_any_run(tmp_path):
    """``LSBENCH_ADDRESS_TIMEOUT_S=x`` was a ValueError traceback when the package was imported; ``-1`` with
    ``--address`` the socket's "Timeout value out of range"; ``LSBENCH_DECODE_CACHE_MB=lots`` passed validate
    and failed every VOC trial with a bare ValueError."""
    (tmp_path / "s.yaml").write_text(study_yaml())
    run = ["run", "s.yaml", "--runs-dir", "runs", "--no-report"]
    cases = [
        (["validate", "s.yaml"], "LSBENCH_ADDRESS_TIMEOUT_S", "x", "a number > 0"),
        (run + ["--executor", "local"], "LSBENCH_ADDRESS_TIMEOUT_S", "x", "a number > 0"),
        (run + ["--address", "127.0.0.1:9"], "LSBENCH_ADDRESS_TIMEOUT_S", "-1", "a number > 0"),
        (["validate", "s.yaml"], "LSBENCH_DECODE_CACHE_MB", "lots", "a number >= 0"),
        (run + ["--executor", "local"], "LSBENCH_DECODE_CACHE_MB", "lots", "a number >= 0"),
        (["validate", "s.yaml"], "LSBENCH_DIST_TIMEOUT_S", "1.5", "a whole number >= 1"),
    ]
    for cmd, name, value, allowed in cases:
        (line,) = _errors(lsbench(*cmd, cwd=tmp_path, env={**CLEAN, name: value}))
        assert line == f"lsbench: error: {name}={value!r} in the environment: allowed: {allowed} (or unset)", line
    assert not (tmp_path / "runs").exists()


def test_every_switch_takes_the_same_words():
    """One parser for every on/off variable: 1/0, true/false, yes/no, on/off in any case, empty; nothing else."""
    import pytest

    from lossscale_bench.core.env_vars import FLAG_VARS, EnvVarError, env_flag

    assert set(FLAG_VARS) == {"LSBENCH_NO_COMPILE", "LSBENCH_NO_NATIVE", "LSBENCH_SKIP_RESOURCE_CHECK"}
    mp = pytest.MonkeyPatch()
    try:
        for name in FLAG_VARS:
            for word, want in [("1", True), ("TRUE", True), ("Yes", True), ("on", True), (" ON ", True)]:
                mp.setenv(name, word)
                assert env_flag(name) is want, (name, word)
            for word in ("0", "false", "NO", "Off", ""):
                mp.setenv(name, word)
                assert env_flag(name) is False, (name, word)
            mp.delenv(name)
            assert env_flag(name) is False
            mp.setenv(name, "maybe")
            with pytest.raises(EnvVarError, match=f"^{name}='maybe' in the environment: allowed: 1, true, yes, on"):
                env_flag(name)
            mp.delenv(name)
    finally:
        mp.undo()


def test_the_resource_check_switch_reads_on_as_its_siblings_do(monkeypatch):
    """``LSBENCH_SKIP_RESOURCE_CHECK=on`` was read as off (its reader took 1, true, yes only)."""
    from lossscale_bench.orchestration.cluster import resource_check_skipped

    monkeypatch.setenv("LSBENCH_SKIP_RESOURCE_CHECK", "on")
    assert resource_check_skipped()


def test_no_module_parses_a_switch_or_a_number_of_its_own():
    """The package reads ``LSBENCH_*`` strings (folders, a URL) with ``os.environ``; every switch and number
    only through ``core.env_vars``, and never when a module is imported."""
    import re
    from pathlib import Path

    import lossscale_bench
    from lossscale_bench.core.env_vars import FLAG_VARS, NUMBER_VARS

    parsed = set(FLAG_VARS) | set(NUMBER_VARS)
    root = Path(lossscale_bench.__file__).parent
    read = re.compile(r"environ(?:\.get)?\s*[\[(]\s*['\"](LSBENCH_[A-Z0-9_]+)|getenv\(\s*['\"](LSBENCH_[A-Z0-9_]+)")
    bad = []
    for path in root.rglob("*.py"):
        if path.name == "env_vars.py":
            continue
        for m in read.finditer(path.read_text()):
            name = m.group(1) or m.group(2)
            if name in parsed:
                bad.append(f"{path.relative_to(root)}: {name}")
    assert not bad, bad


def test_zero_trials_at_once_or_zero_cpus_are_refused(tmp_path):
    """``--max-concurrent 0`` and ``--num-cpus 0`` started nothing that could run a trial."""
    (tmp_path / "s.yaml").write_text(study_yaml())
    for flag in ("--max-concurrent", "--num-cpus"):
        r = lsbench("run", "s.yaml", "--runs-dir", "runs", "--no-report", flag, "0", cwd=tmp_path, env=CLEAN)
        assert r.returncode == 2, (flag, r.returncode, r.stderr[-2000:])
        assert (
            r.stderr.strip().splitlines()[-1]
            == f"lsbench run: error: argument {flag}: '0': a whole number of 1 or more"
        )
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()
