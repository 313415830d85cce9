"""The package's layers (written in ``lossscale_bench/__init__.py``), checked on the import graph.

Every ``import``/``from ... import`` of a lossscale_bench module, at module level or inside a
function, is read with ``ast`` (nothing is imported). A module may import its own layer or the
layers below it, never one above, and the module graph has no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lossscale_bench

PKG = Path(lossscale_bench.__file__).resolve().parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """lossscale_bench modules imported by the file (``from . import x`` resolved to ``pkg.x``)."""
    mod = _module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = set()  # `if TYPE_CHECKING:` imports never run
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("lossscale_bench")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("lossscale_bench"):
                target = node.module
            else:
                continue
            out.add(target)
            for a in node.names:  # `from . import x` may name a submodule
                if (PKG.parent / Path(*f"{target}.{a.name}".split("."))).with_suffix(".py").exists() or \
                        (PKG.parent / Path(*f"{target}.{a.name}".split("."))).is_dir():
                    out.add(f"{target}.{a.name}")
    return out


def _graph() -> dict[str, set[str]]:
    files = [p for p in PKG.rglob("*.py") if "studies" not in p.parts]
    return {_module_name(p): _imports(p) for p in files}


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return 0  # the package itself (docstring and version only)
    top = parts[1]
    for i, (_, names) in enumerate(lossscale_bench.LAYERS):
        if top in names or any(n.endswith("*") and top.startswith(n[:-1]) for n in names):
            return i
    raise AssertionError(f"{module}: not placed in any layer of lossscale_bench.LAYERS")


def test_every_module_has_a_layer():
    for module in _graph():
        _layer(module)


def test_imports_point_down_the_layers():
    bad = []
    for module, deps in _graph().items():
        for dep in deps:
            if dep == "lossscale_bench" or not dep.startswith("lossscale_bench."):
                continue
            if _layer(dep) > _layer(module):
                bad.append(f"{module} (layer {lossscale_bench.LAYERS[_layer(module)][0]}) imports {dep} "
                           f"(layer {lossscale_bench.LAYERS[_layer(dep)][0]})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_circles():
    graph = _graph()
    # a package's __init__ importing its own submodules is how packages work; a submodule
    # importing its package back for a name is a circle only if the __init__ also imports it
    state: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if d not in graph or d == m:
                continue
            if state.get(d) == 1:
                circles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_the_checker_sees_a_bad_import(tmp_path):
    """The graph reader finds relative, absolute and function-local imports (so the tests above can fail)."""
    f = PKG / "engine" / "loop.py"
    deps = _imports(f)
    assert "lossscale_bench.scaling.base" in deps and "lossscale_bench.precision" in deps
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from ..orchestration.study_runner import run_study\n")
    tree = ast.parse(src.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert node.level == 2 and node.module == "orchestration.study_runner"  # what _imports resolves against the module's package
    assert _layer("lossscale_bench.orchestration.study_runner") > _layer("lossscale_bench.engine.loop")


def test_data_never_imports_study():
    """The dataset-file parsers sit below both (``dataset_files``); the loaders do not reach into the
    study package (issue 30: data <-> study was the main back-and-forth of a trial's data path)."""
    wrong = {m: sorted(t for t in targets if t.startswith("lossscale_bench.study"))
             for m, targets in _graph().items() if m.startswith("lossscale_bench.data")}
    assert {m: t for m, t in wrong.items() if t} == {}
