"""One version: ``lossscale_bench.__version__``, which pyproject.toml reads, `lsbench --version` prints and
CHANGELOG.md's newest section names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import lsbench

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_one_version_everywhere():
    from lossscale_bench import __version__

    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lossscale_bench.__version__"}
    newest = re.search(r"^## (\S+) \((\d{4}-\d\d-\d\d)\)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert newest and newest.group(1) == __version__, "CHANGELOG.md's newest section is not the package's version"


def test_the_changelog_is_in_versions_newest_first():
    heads = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    parsed = [re.fullmatch(r"(\d+)\.(\d+)\.(\d+) \((\d{4}-\d\d-\d\d)\)", h) for h in heads]
    assert all(parsed), [h for h, m in zip(heads, parsed) if not m]
    versions = [tuple(int(x) for x in m.groups()[:3]) for m in parsed]
    dates = [m.group(4) for m in parsed]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions), heads
    assert dates == sorted(dates, reverse=True), heads


def test_lsbench_version_prints_it():
    from lossscale_bench import __version__

    r = lsbench("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"lsbench {__version__}", (r.stdout, r.stderr)
