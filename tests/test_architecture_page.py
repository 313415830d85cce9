"""docs/development/architecture.md follows ``FLOORS`` (tests/test_structure.py) and lists every module.

The page's floors table and its "Every module, floor by floor" section are written by hand; this test
checks them against the package: each floor's packages as ``FLOORS`` has them, in its order, and each
module of the package in one row under its own floor. A missing module fails with the row to add.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_structure import FLOORS, PKG, package_files

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "development" / "architecture.md"


def _top(rel: str) -> str:
    return rel.split("/")[0].removesuffix(".py")


def page_floors(text: str) -> list[tuple[list[str], list[str]]]:
    """``([packages], [modules])`` of each ``### Floor N: a, b`` section, in page order."""
    floors = []
    for m in re.finditer(r"^### Floor (\d+): (.+)$", text, re.M):
        assert int(m.group(1)) == len(floors) + 1, f"floor {m.group(1)} out of order"
        body = text[m.end() :].split("\n### ", 1)[0].split("\n## ", 1)[0]
        floors.append(([n.strip() for n in m.group(2).split(",")], re.findall(r"^\| `([^`]+)` \|", body, re.M)))
    return floors


def package_modules() -> list[str]:
    return [p.relative_to(PKG).as_posix() for p in package_files() if p.relative_to(PKG).as_posix() != "__init__.py"]


def test_every_floors_name_exists():
    names = {_top(m) for m in package_modules()}
    missing = [n for floor in FLOORS for n in floor if n not in names]
    assert not missing, f"FLOORS names {missing}, which the package does not have"


def test_the_page_has_the_floors_of_FLOORS():
    floors = page_floors(PAGE.read_text(encoding="utf-8"))
    assert [names for names, _ in floors] == FLOORS
    table = re.findall(r"^\| (\d+) \| (.+?) \|", PAGE.read_text(encoding="utf-8"), re.M)
    assert [[n.strip("`/").removesuffix(".py") for n in cell.split(", ")] for _, cell in table] == FLOORS


def test_every_module_is_on_the_page_under_its_floor():
    floors = page_floors(PAGE.read_text(encoding="utf-8"))
    where = {m: i for i, (_, mods) in enumerate(floors) for m in mods}
    problems = []
    for module in package_modules():
        floor = next(i for i, names in enumerate(FLOORS) if _top(module) in names)
        heading = f"### Floor {floor + 1}: {', '.join(FLOORS[floor])}"
        if module not in where:
            problems.append(
                f"{module} is not on {PAGE.relative_to(ROOT)}: add '| `{module}` | what it does |' under '{heading}'"
            )
        elif where[module] != floor:
            problems.append(f"{module} is listed under floor {where[module] + 1}; it belongs under '{heading}'")
    gone = sorted(set(where) - set(package_modules()))
    problems += [f"{m} is on {PAGE.relative_to(ROOT)} but not in the package: remove its row" for m in gone]
    assert not problems, "\n".join(problems)
