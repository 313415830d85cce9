"""The API reference (docs/reference/api/*.md, mkdocstrings) and the modules' ``__all__`` stay in step.

Each ``::: dotted.name`` directive names a module of the package or a name defined in one; every name in
the ``__all__`` of a documented module (``DOCUMENTED``) appears on an API page, either in a ``members:``
list under that module's directive or as a directive of its own; the package's lazy names too. Read from
the sources (ast), nothing imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "reference" / "api").glob("*.md"))
#: the modules whose public names the reference documents (the surface a loop of one's own uses)
DOCUMENTED = [
    "lossscale_bench.library",
    "lossscale_bench.scaling",
    "lossscale_bench.scaling.base",
    "lossscale_bench.scaling.per_layer",
    "lossscale_bench.precision",
    "lossscale_bench.lightning",
    "lossscale_bench.study.plugins",
    "lossscale_bench.core.plugins",
]


def _file(module: str) -> Path | None:
    base = ROOT / Path(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def _names(path: Path) -> tuple[list[str] | None, set[str]]:
    """(``__all__`` or None, every name the module binds at top level)."""
    tree = ast.parse(path.read_text())
    listed, bound = None, set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    bound.add(t.id)
                    if t.id == "__all__":
                        listed = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom):
            bound |= {a.asname or a.name for a in node.names}
    return listed, bound


def _directives() -> list[tuple[Path, str, list[str]]]:
    """(page, dotted name, members listed under it) of every ``:::`` directive."""
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r":::\s+(\S+)", line)
            if not m:
                continue
            members, j = [], i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                if (mm := re.match(r"\s+-\s+(\w+)\s*$", lines[j])) is not None:
                    members.append(mm.group(1))
                if not lines[j].strip() and j + 1 < len(lines) and not lines[j + 1].startswith(" "):
                    break
                j += 1
            out.append((page, m.group(1), members))
    return out


def test_every_directive_names_something_that_exists():
    assert PAGES
    for page, dotted, members in _directives():
        path = _file(dotted)
        if path is None:  # module.name
            module, _, name = dotted.rpartition(".")
            path = _file(module)
            assert path is not None, f"{page.name}: no module for {dotted}"
            assert name in _names(path)[1], f"{page.name}: {module} defines no {name}"
        else:
            bound = _names(path)[1]
            missing = [m for m in members if m not in bound]
            assert not missing, f"{page.name}: {dotted} has no {missing}"


def test_every_public_name_of_the_documented_modules_is_on_a_page():
    shown: dict[str, set[str]] = {}
    for _, dotted, members in _directives():
        if _file(dotted) is not None:
            shown.setdefault(dotted, set()).update(members)
        else:
            module, _, name = dotted.rpartition(".")
            shown.setdefault(module, set()).add(name)
    for module in DOCUMENTED:
        listed, _ = _names(_file(module))
        assert listed is not None, f"{module} has no __all__"
        missing = sorted(set(listed) - shown.get(module, set()))
        assert not missing, f"{module}: {missing} in __all__ but on no API page (docs/reference/api/)"
        extra = sorted(shown.get(module, set()) - set(listed))
        assert not extra, f"{module}: {extra} on an API page but not in __all__"


def test_the_packages_lazy_names_are_documented():
    listed, _ = _names(_file("lossscale_bench"))
    text = "\n".join(p.read_text() for p in PAGES)
    assert listed and all(re.search(rf"\b{name}\b", text) for name in listed)
