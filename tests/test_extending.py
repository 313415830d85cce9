"""The recipe page (docs/development/extending.md, linked from the README), done as written: a new
per-layer method and a new precision in a copy of the package, run through ``lsbench run`` and
``lsbench report --telemetry``.

Why a copy and the page's own code blocks: the claim is that a method is its scaler file, its
entry and its registry name, and a precision its table entry and its registry name, with no other
edit. The test makes exactly those edits (the files are the page's blocks, verbatim; the names are
appended to the registry's tuples) in a copy of ``lossscale_bench`` and runs the real CLI on it in a
fresh interpreter, so a recipe that misses a step, or code that still names the shipped methods or
precisions somewhere, fails here. The copy is deleted with ``tmp_path``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import study_yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "docs" / "development" / "extending.md"


def _recipe_blocks() -> list[tuple[str, str]]:
    """(path, code) of every python block of the recipe page; ``path`` is its first line's comment."""
    section = RECIPE.read_text()
    blocks = []
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.S):
        lines = [line[3:] if line.startswith("   ") else line for line in block.splitlines()]  # list indent
        first, body = lines[0], "\n".join(lines[1:]) + "\n"
        assert first.startswith("# lossscale_bench/"), first
        blocks.append((first[2:].split(":")[0].strip(), body))
    return blocks


def _append_name(registry: Path, tuple_name: str, name: str) -> None:
    """Step "its name, appended to <tuple> in lossscale_bench/core/registry.py"."""
    text = registry.read_text()
    # one line or one name a line (the formatter's layout, with a trailing comma): the name goes last
    new, n = re.subn(rf"^({tuple_name} = \(.*?)\s*,?\s*\)", rf'\1, "{name}")', text, count=1, flags=re.M | re.S)
    assert n == 1, tuple_name
    registry.write_text(new)


def _extended_package(where: Path) -> tuple[str, str]:
    """A copy of the package under ``where`` with the recipe's method and precision; their names."""
    pkg = where / "lossscale_bench"
    shutil.copytree(ROOT / "lossscale_bench", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    method = precision = None
    for path, code in _recipe_blocks():
        target = where / path
        if path.endswith("study/precisions.py"):  # one more PrecisionSpec in the table
            precision = re.search(r'PrecisionSpec\("([^"]+)"', code).group(1)
            text = target.read_text()
            assert "_SPECS = (\n" in text
            target.write_text(text.replace("_SPECS = (\n", "_SPECS = (\n" + code, 1))
        else:  # a new module
            assert not target.exists(), path
            target.write_text(code)
            if "/study/methods/" in path:
                method = re.search(r'method: Literal\["([^"]+)"\]', code).group(1)
    assert method and precision, "the recipe shows a method and a precision"
    _append_name(pkg / "core/registry.py", "SCALING_METHODS", method)
    _append_name(pkg / "core/registry.py", "PRECISIONS", precision)
    return method, precision


def _lsbench(where: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where / "pkg"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "lossscale_bench.cli", *map(str, args)],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_the_readme_recipe_gives_a_working_method_and_precision(tmp_path):
    (tmp_path / "pkg").mkdir()
    method, precision = _extended_package(tmp_path / "pkg")
    study = tmp_path / "ext.yaml"
    study.write_text(
        study_yaml(
            name="ext",
            precision=precision,
            log_every=2,
            schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 2},
            scaling=[f"{{method: {method}, exponent: 8}}", "{method: fixed, scale: 128}"],
        )
    )
    r = _lsbench(tmp_path, "run", study, "--executor", "local", "--runs-dir", "runs", "--quiet")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "2 finished" in r.stdout, r.stdout[-2000:]
    assert "static 2^8 per layer" in r.stdout  # the entry's label in the report
    assert "gradients rounded to float8 E5M2" in r.stdout  # the precision's note under its table

    r = _lsbench(tmp_path, "report", "--runs-dir", "runs", "--study", "ext", "--telemetry")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in r.stdout.splitlines()
        if line.startswith("| ") and precision in line
    }
    head = next(line for line in r.stdout.splitlines() if line.startswith("| row"))
    col = [c.strip() for c in head.split("|")[2:-1]].index("layer scale log2, median (last)")
    assert rows["static 2^8 per layer"][col] == "8", r.stdout  # every point at 2^8, from the method's metrics
    assert rows["loss scale (128)"][col] == "–"  # a global method has no layer scales
    assert rows["static 2^8 per layer"][0] == precision
