"""The package's shape, checked on its source with ``ast`` (nothing is imported, no third-party tool).

The limits, each with its reason:

* no module over ``MAX_MODULE_LINES`` lines: a module a reader can hold in mind does one job;
* no function over ``MAX_FUNCTION_LINES`` lines: a longer one does several things under one name;
* no import of another module's underscore names (function, class, constant or module): a name that
  another module uses is an interface, so it is public (in its module's ``__all__``, documented);
* no re-export: a module other than a package's ``__init__.py`` lists in ``__all__`` only the names it
  defines itself (``def``, ``class``, assignment); a name it only imports belongs to the module that
  defines it, and its users import it from there (a package's ``__init__.py`` gathers its modules'
  names: that is its job);
* no import circle between modules: a circle makes the import order, and so the code, fragile;
* no import against ``FLOORS``: each floor imports its own floor and those below, never one above,
  so a reader can learn the package from the bottom up and a change moves effects upwards only.

Every ``import`` / ``from ... import`` counts, at module level or inside a function (a lazy import
still ties the modules together), except those under ``if TYPE_CHECKING:``, which never run.
Tests, benchmarks and the studies folder are not checked by these limits.

The tests mirror the package, so a module's tests are found without a search: a test of one subpackage
is in ``tests/<subpackage>/``, every folder of ``tests/`` is named after a subpackage, and a test file
at the top of ``tests/`` is one of ``WHOLE_PRODUCT`` (tests of the product as a whole: the command,
the docs, the benchmark tools, the top-level modules), each listed with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lossscale_bench"
TESTS = Path(__file__).resolve().parent
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80

#: The floors, bottom to top: the top-level packages and modules of ``lossscale_bench`` on each.
FLOORS = [
    ["core", "numerics"],  # names, ranges, exit codes, small helpers; the rounding kernels (torch only)
    ["dataset_files"],  # how VOC/COCO files and the synthetic cache are read: below both study and data
    ["study"],  # the study file: schema, loading, grid, trial ids, method and precision entries; no torch
    ["precision", "scaling", "data", "models", "evaluation", "backends"],  # the components a trial is built from
    # the training loop, its hooks, and the sink it reports through; beside it, for loops of one's own, the
    # public factory and telemetry (library: scalers and precisions, as the loop uses them) and the Lightning
    # plugin built on it (lightning: a user's loop again, Lightning's; no trial, tracking or study runner)
    ["engine", "library", "lightning"],
    ["trial"],  # one trial from its config; no Ray, no MLflow
    ["tracking", "orchestration"],  # the MLflow store; running a study (in-process or Ray)
    ["report"],  # runs -> tables, plots, files
    [
        "cli",
        "cli_args",
        "cli_report",
        "cli_plugins",
        "seed_rounds",
    ],  # lsbench commands; seed_rounds drives the runner and reads the verdicts
]

#: Modules exempt from the length limit and from the underscore rule (others may import them), with the reason.
EXCEPTIONS: dict[str, str] = {}  # module name -> why it may break a limit (none does today)

#: Upward imports allowed by name (importer, imported), with the reason.
UPWARD: dict[tuple[str, str], str] = {
    ("lossscale_bench", "lossscale_bench.library"): "the package's lazy facade: its __getattr__ imports the public"
    " factory on first use of lossscale_bench.create_scaler & co., so importing the package stays torch-free"
}

#: The test files at the top of ``tests/``: each tests the product as a whole (or a top-level module), with the
#: reason; every other test file is in the folder of the subpackage it tests.
WHOLE_PRODUCT: dict[str, str] = {
    "test_api_pages.py": "the API reference pages against every documented module's __all__",
    "test_architecture_page.py": "docs/development/architecture.md against FLOORS and every module",
    "test_benchmark_harness.py": "benchmarks/harness.py, outside the package",
    "test_cli.py": "the lsbench command's contract: one-line errors, exit code 2, dry runs",
    "test_docs_prose.py": "the prose of README.md, CHANGELOG.md, docs/ and the study files",
    "test_docs_site.py": "the documentation site, built and loaded in a browser",
    "test_e2e.py": "a study through lsbench run, Ray Tune, MLflow and the report",
    "test_eval_curve_tool.py": "benchmarks/eval_curve.py, outside the package",
    "test_exit_codes.py": "the exit codes of lsbench run, from its trials' outcomes",
    "test_extending.py": "docs/development/extending.md done as written, in a copy of the package and outside it",
    "test_gpu_check.py": "benchmarks/gpu_check.py, outside the package",
    "test_guide_pages.py": "the code of the guide pages, run as written",
    "test_host_memory_tool.py": "benchmarks/host_memory.py, outside the package",
    "test_kangaroo.py": "the real photos through lsbench run, Ray Tune, MLflow and the report",
    "test_library.py": "library.py, a top-level module: the public factory in a loop of one's own",
    "test_lightning.py": "lightning.py, a top-level module: the Lightning plugin in a real Trainer",
    "test_plugins.py": "detectors from outside the package, validated, trained and reported",
    "test_reference_docs.py": "docs/reference/ against tools/gen_reference.py's output for today's code",
    "test_run_environment.py": "what lsbench validate and run refuse in the environment before training",
    "test_seed_rounds.py": "seed_rounds.py, a top-level module: rounds of seeds through lsbench run",
    "test_side_by_side_tool.py": "benchmarks/side_by_side.py, outside the package",
    "test_step_ratio_tool.py": "benchmarks/step_ratio.py, outside the package",
    "test_structure.py": "the package's shape and the tests' layout",
    "test_version.py": "one version in the package, pyproject.toml, lsbench --version and CHANGELOG.md",
}

#: Packages of one floor that must not import each other, with the reason.
APART = [
    (
        "data",
        "study",
        "the data loaders and the study schema read dataset files through dataset_files, not through each other",
    )
]


def module_name(path: Path, root: Path = PKG) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def package_files(root: Path = PKG) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "studies" not in p.relative_to(root).parts)


def _typing_only(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def imports(path: Path, root: Path = PKG) -> list[tuple[str, list[str], int]]:
    """``(module imported, names imported from it, line)`` for each lossscale_bench import in ``path``;
    ``from . import x`` of a submodule ``x`` counts as an import of that submodule."""
    mod = module_name(path, root)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = _typing_only(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "lossscale_bench"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "lossscale_bench":
                target = node.module
            else:
                continue
            names = []
            for a in node.names:
                sub = root.parent / Path(*f"{target}.{a.name}".split("."))
                if sub.with_suffix(".py").exists() or sub.is_dir():
                    out.append((f"{target}.{a.name}", [], node.lineno))
                else:
                    names.append(a.name)
            out.append((target, names, node.lineno))
    return out


def graph(root: Path = PKG) -> dict[str, set[str]]:
    return {module_name(p, root): {t for t, _, _ in imports(p, root)} for p in package_files(root)}


def floor(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return 0  # the package itself: its docstring and version
    for i, names in enumerate(FLOORS):
        if parts[1] in names:
            return i
    raise AssertionError(f"{module}: on no floor of FLOORS")


def long_modules(root: Path = PKG) -> list[str]:
    return [
        f"{module_name(p, root)}: {n} lines"
        for p in package_files(root)
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES and module_name(p, root) not in EXCEPTIONS
    ]


def long_functions(root: Path = PKG) -> list[str]:
    out = []
    for p in package_files(root):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{module_name(p, root)}.{node.name} (line {node.lineno}): {n} lines")
    return out


def underscore_imports(root: Path = PKG) -> list[str]:
    """Imports of another module's underscore names, or of an underscore module."""
    out = []
    for p in package_files(root):
        mod = module_name(p, root)
        for target, names, line in imports(p, root):
            if target == mod:
                continue
            private_module = any(part.startswith("_") and not part.startswith("__") for part in target.split("."))
            if private_module and target not in EXCEPTIONS:
                out.append(f"{mod}:{line} imports module {target}")
            bad = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if bad:
                out.append(f"{mod}:{line} imports {', '.join(bad)} from {target}")
    return out


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run at import: the module's own, and those inside its ``if``/``try``/``with``."""
    out, todo = [], list(tree.body)
    while todo:
        stmt = todo.pop(0)
        out.append(stmt)
        if isinstance(stmt, (ast.If, ast.Try, ast.With)):
            todo += stmt.body + getattr(stmt, "orelse", []) + getattr(stmt, "finalbody", [])
            todo += [s for h in getattr(stmt, "handlers", []) for s in h.body]
    return out


def _targets(stmt: ast.stmt) -> list[ast.expr]:
    """What an assignment binds (``=``, ``+=``, annotated); nothing for any other statement."""
    if isinstance(stmt, ast.Assign):
        return stmt.targets
    return [stmt.target] if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else []


def _listed(tree: ast.Module) -> list[str]:
    """The names of the module's ``__all__`` (a list or tuple of strings; ``+=`` counts too)."""
    return [
        e.value
        for stmt in _module_level(tree)
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in _targets(stmt)) and stmt.value is not None
        for e in ast.walk(stmt.value)
        if isinstance(e, ast.Constant) and isinstance(e.value, str)
    ]


def reexports(root: Path = PKG) -> list[str]:
    """Modules (not a package's ``__init__.py``) whose ``__all__`` lists names they only import."""
    out = []
    for p in package_files(root):
        if p.name == "__init__.py":
            continue
        tree = ast.parse(p.read_text(), str(p))
        defined, imported = set(), set()
        for stmt in _module_level(tree):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(stmt.name)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                imported |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
            defined |= {n.id for t in _targets(stmt) for n in ast.walk(t) if isinstance(n, ast.Name)}
        bad = [n for n in _listed(tree) if n in imported and n not in defined]
        if bad:
            out.append(f"{module_name(p, root)} re-exports {', '.join(bad)}")
    return out


def upward_imports(root: Path = PKG) -> list[str]:
    out = []
    for mod, deps in graph(root).items():
        for dep in deps:
            if dep.startswith("lossscale_bench.") and floor(dep) > floor(mod) and (mod, dep) not in UPWARD:
                out.append(f"{mod} (floor {floor(mod) + 1}) imports {dep} (floor {floor(dep) + 1})")
    for low, high, _ in APART:
        out += [
            f"{mod} imports {dep} (kept apart)"
            for mod, deps in graph(root).items()
            if mod.split(".")[1:2] == [low]
            for dep in deps
            if dep.split(".")[1:2] == [high]
        ]
    return sorted(out)


def circles(root: Path = PKG) -> list[str]:
    g = graph(root)
    state: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if d not in g or d == m:
                continue
            if state.get(d) == 1:
                found.append(" -> ".join(stack[stack.index(d) :] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    return found


@pytest.mark.parametrize(
    "check",
    [long_modules, long_functions, underscore_imports, reexports, upward_imports, circles],
    ids=lambda f: f.__name__,
)
def test_the_package_keeps_its_shape(check):
    found = check()
    assert not found, f"{len(found)} found:\n" + "\n".join(found)


def misplaced_tests(tests: Path = TESTS, root: Path = PKG, listed: dict[str, str] = WHOLE_PRODUCT) -> list[str]:
    """Test files and folders of ``tests/`` out of the package's layout."""
    out = [
        f"tests/{p.name}: at the top of tests/ and not in WHOLE_PRODUCT (a subpackage's test is in its folder)"
        for p in sorted(tests.glob("test_*.py"))
        if p.name not in listed
    ]
    out += [
        f"WHOLE_PRODUCT lists {name}, which is not in tests/" for name in sorted(listed) if not (tests / name).exists()
    ]
    out += [
        f"tests/{d.name}/: no subpackage lossscale_bench/{d.name}/"
        for d in sorted(tests.iterdir())
        if d.is_dir() and not d.name.startswith((".", "__")) and not (root / d.name / "__init__.py").exists()
    ]
    return out


def test_each_test_is_in_its_subpackages_folder():
    found = misplaced_tests()
    assert not found, f"{len(found)} found:\n" + "\n".join(found)


def test_every_module_is_on_a_floor():
    for module in graph():
        floor(module)


def test_the_checks_see_what_they_look_for(tmp_path):
    """Each check finds a planted fault (so the tests above can fail)."""
    pkg = tmp_path / "lossscale_bench"
    (pkg / "core").mkdir(parents=True)
    (pkg / "trial").mkdir()
    for d in (pkg, pkg / "core", pkg / "trial"):
        (d / "__init__.py").write_text("")
    (pkg / "core" / "low.py").write_text("def f():\n    from ..trial.high import g\n" + "    x = 1\n" * 80 + "\n" * 380)
    (pkg / "trial" / "high.py").write_text(
        "from ..core.low import f, _hidden\n\n__all__ = ['g', 'f', 'h']\nh = 1\n\n\ndef g():\n    pass\n"
    )
    (pkg / "trial" / "__init__.py").write_text("from .high import g\n\n__all__ = ['g']\n")  # gathering: allowed
    assert long_modules(pkg) == ["lossscale_bench.core.low: 462 lines"]
    assert long_functions(pkg) == ["lossscale_bench.core.low.f (line 1): 82 lines"]
    assert underscore_imports(pkg) == ["lossscale_bench.trial.high:1 imports _hidden from lossscale_bench.core.low"]
    assert reexports(pkg) == ["lossscale_bench.trial.high re-exports f"]
    assert upward_imports(pkg) == ["lossscale_bench.core.low (floor 1) imports lossscale_bench.trial.high (floor 6)"]
    assert circles(pkg) == ["lossscale_bench.core.low -> lossscale_bench.trial.high -> lossscale_bench.core.low"]


def test_the_layout_check_sees_what_it_looks_for(tmp_path):
    """A subpackage's test at the top of tests/, a listed file gone, and a folder named after no subpackage."""
    pkg, tests = tmp_path / "lossscale_bench", tmp_path / "tests"
    (pkg / "core").mkdir(parents=True)
    (pkg / "core" / "__init__.py").write_text("")
    (tests / "core").mkdir(parents=True)
    (tests / "elsewhere").mkdir()
    for name in ("test_cli.py", "test_writable.py", "helpers.py", "core/test_portable.py", "elsewhere/test_x.py"):
        (tests / name).write_text("")
    listed = {"test_cli.py": "the command", "test_gone.py": "removed since"}
    assert misplaced_tests(tests, pkg, listed) == [
        "tests/test_writable.py: at the top of tests/ and not in WHOLE_PRODUCT (a subpackage's test is in its folder)",
        "WHOLE_PRODUCT lists test_gone.py, which is not in tests/",
        "tests/elsewhere/: no subpackage lossscale_bench/elsewhere/",
    ]
