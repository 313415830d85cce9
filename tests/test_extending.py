"""The recipe page (docs/development/extending.md), done as written, both ways: a model, a data set, a
per-layer method and a precision added to a copy of the package, and the same four in a separate
package found through its ``.dist-info`` folder; each trained through ``lsbench run`` and read back
with ``lsbench report --telemetry``.

Why the page's own code blocks: the claim is that a plug-in is its description (and its code) with no
other edit: in the package, no list of names to extend; outside it, no edit to the package at all. The
test writes exactly the page's blocks (the first line of each names its file) and runs the real CLI
in a fresh interpreter, so a recipe that misses a step, or code that still names the shipped plug-ins
somewhere, fails here. The separate package is "installed" the way an installer leaves it: its
``pyproject.toml`` entry points become the ``entry_points.txt`` of a ``mylsb-0.1.dist-info`` folder on
``PYTHONPATH``, which ``importlib.metadata`` reads (FIELD-NOTES "Servers, plug-ins, Lightning").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from helpers import study_yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "docs" / "development" / "extending.md"
#: the four plug-ins the page adds, each way
NAMES = {"model": "ssd_mini", "dataset": "shapes", "method": "static_pow2", "precision": "e5m2-grads-emulated"}


def _recipe_blocks() -> list[tuple[str, str]]:
    """(path, code) of every code block of the recipe page; ``path`` is its first line's comment."""
    blocks = []
    for block in re.findall(r"```(?:python|toml)\n(.*?)```", RECIPE.read_text(), flags=re.S):
        lines = [line[3:] if line.startswith("   ") else line for line in block.splitlines()]  # list indent
        first, body = lines[0], "\n".join(lines[1:]) + "\n"
        assert first.startswith("# "), first
        blocks.append((first[2:].split(":")[0].strip(), body))
    return blocks


def _insert(target: Path, marker: str, code: str) -> None:
    """One more entry of a table or one more class of a module: ``code`` put before ``marker``."""
    text = target.read_text()
    assert marker in text, (target, marker)
    target.write_text(text.replace(marker, code + marker, 1))


def _extended_package(where: Path) -> None:
    """A copy of the package under ``where`` with the page's in-package blocks."""
    shutil.copytree(ROOT / "lossscale_bench", where / "lossscale_bench", ignore=shutil.ignore_patterns("__pycache__"))
    written = 0
    for path, code in _recipe_blocks():
        if not path.startswith("lossscale_bench/"):
            continue
        target = where / path
        if path.endswith("study/precisions.py"):  # one more PrecisionSpec in the table
            _insert(target, "_SPECS = (\n", "")
            target.write_text(target.read_text().replace("_SPECS = (\n", "_SPECS = (\n" + code, 1))
        elif path.endswith("study/datasets.py"):  # one more class, above `def _loaded`
            _insert(target, 'plugins.DESCRIBERS["dataset"] = _describe_entry_point\n', code + "\n\n")
        else:  # a new module
            assert not target.exists(), path
            target.write_text(code)
        written += 1
    assert written == 7, "the page shows a model (2 files), a data set (2), a method (2) and a precision (1)"


def _separate_package(where: Path) -> None:
    """The page's separate package under ``where``, with the dist-info an installer would write."""
    project = None
    for path, code in _recipe_blocks():
        if path == "pyproject.toml":
            project = tomllib.loads(code)["project"]
        elif not path.startswith("lossscale_bench/"):
            (where / path).parent.mkdir(parents=True, exist_ok=True)
            (where / path).write_text(code)
    (where / "mylsb" / "__init__.py").touch()
    info = where / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
            for group, eps in project["entry-points"].items()
        )
    )


def _lsbench(where: Path, path: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "lossscale_bench.cli", *map(str, args)],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _study(tmp_path: Path) -> Path:
    study = tmp_path / "ext.yaml"
    study.write_text(
        study_yaml(
            name="ext",
            dataset="{name: shapes, images: 8}",
            model=NAMES["model"],
            model_options=None,
            batch_size=2,
            precision=NAMES["precision"],
            log_every=2,
            schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 2},
            scaling=[f"{{method: {NAMES['method']}, exponent: 8}}", "{method: fixed, scale: 128}"],
        )
    )
    return study


def _run_and_report(tmp_path: Path, path: Path) -> None:
    """The four plug-ins validate, train and report with the layer scales of the new method."""
    study = _study(tmp_path)
    r = _lsbench(tmp_path, path, "validate", study)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _lsbench(tmp_path, path, "run", study, "--executor", "local", "--runs-dir", "runs", "--quiet")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "2 finished" in r.stdout, r.stdout[-2000:]
    assert "static 2^8 per layer" in r.stdout  # the entry's label in the report
    assert f"† {NAMES['precision']}: these numbers come from a CPU emulation" in r.stdout  # its table entry's note
    assert "static 2^8 per layer †" in r.stdout  # an emulation, marked from its table entry (never from its name)
    assert "SSD-mini" in r.stdout or "ssd_mini" in r.stdout  # the model's name in the table heading

    r = _lsbench(tmp_path, path, "report", "--runs-dir", "runs", "--study", "ext", "--telemetry")
    assert r.returncode == 0, r.stderr[-3000:]
    precision = NAMES["precision"]
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


@pytest.mark.slow
def test_the_recipe_in_the_package(tmp_path):
    (tmp_path / "pkg").mkdir()
    _extended_package(tmp_path / "pkg")
    _run_and_report(tmp_path, tmp_path / "pkg")
    r = _lsbench(tmp_path, tmp_path / "pkg", "plugins")
    for name in NAMES.values():
        assert re.search(rf"^  {re.escape(name)}\s+built in$", r.stdout, flags=re.M), r.stdout


@pytest.mark.slow
def test_the_recipe_as_a_separate_package(tmp_path):
    (tmp_path / "site").mkdir()
    _separate_package(tmp_path / "site")
    _run_and_report(tmp_path, tmp_path / "site")
    r = _lsbench(tmp_path, tmp_path / "site", "plugins")
    assert r.returncode == 0, r.stderr[-2000:]
    for kind, name in NAMES.items():
        group = f"lossscale_bench.{kind}s"
        assert re.search(rf"^  {re.escape(name)}\s+entry point {group} of mylsb 0.1  sha256:\w+$", r.stdout, re.M), (
            r.stdout
        )


def test_the_page_says_how_to_regenerate_the_reference():
    text = RECIPE.read_text()
    assert "python tools/gen_reference.py" in text and "--check" in text
