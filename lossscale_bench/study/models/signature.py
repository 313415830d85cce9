"""A plug-in named by import path (``package.module:callable``): found, its options read from the
callable's signature, and its source digested, without running the module where it can be helped.

The module is looked for first in the study file's folder, then on ``sys.path``. A callable written
as a plain ``def`` (or a class) in that module is read from the source with :mod:`ast` (so
``lsbench validate`` stays instant: nothing is imported); one bound otherwise (an assignment, an
import from elsewhere) is imported to read its signature. An option's doc is its line in the
docstring's ``Args:`` section.
"""

from __future__ import annotations

import ast
import re
import sys
from contextlib import contextmanager

from ...core.plugins import OFFERED_PARAMS, Option, Plugin, PluginError, file_digest, module_file

__all__ = ["import_path_plugin"]

#: the parameter every builder gets from the trial, not from the study
FIXED_PARAMS = {"model": ("num_classes",), "dataset": ()}


@contextmanager
def on_path(folder: str | None):
    """``folder`` first on ``sys.path`` for the block (where a study's own modules are found)."""
    if not folder:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:  # pragma: no cover - removed by the plug-in itself
            pass


def _arg_docs(doc: str | None) -> dict[str, str]:
    """``name -> text`` from a Google-style ``Args:`` section."""
    out, inside = {}, False
    for line in (doc or "").splitlines():
        s = line.strip()
        if s in ("Args:", "Arguments:", "Parameters:"):
            inside = True
            continue
        if inside:
            if not s or re.fullmatch(r"\w+:", s):  # a blank line or the next section ends it
                inside = False
                continue
            m = re.match(r"\**(\w+)(?:\s*\([^)]*\))?:\s+(.*)", s)
            if m and m.group(1) not in out:
                out[m.group(1)] = m.group(2)
    return out


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def _from_source(path: str, attr: str) -> tuple[list[tuple], bool, str] | None:
    """``(params, takes_any, doc)`` of a ``def`` or class ``attr`` in ``path``; ``None`` where it is bound
    otherwise; ``PluginError`` where the module does not bind it at all."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
    except (OSError, SyntaxError, ValueError) as exc:
        raise PluginError(f"cannot read {path}: {exc}") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr:
            return _params(node.args, skip_self=False), node.args.kwarg is not None, ast.get_docstring(node) or ""
        if isinstance(node, ast.ClassDef) and node.name == attr:
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if init is None:
                return None
            return _params(init.args, skip_self=True), init.args.kwarg is not None, ast.get_docstring(node) or ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            bound = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign):
            bound = [node.target.id] if isinstance(node.target, ast.Name) else []
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = [a.asname or a.name.split(".")[0] for a in node.names]
        else:
            continue
        if attr in bound:
            return None
    raise PluginError(f"module {path} has no attribute {attr!r}")


def _params(args: ast.arguments, skip_self: bool) -> list[tuple]:
    """``(name, annotation text, default, has_default)`` of the keyword-capable parameters."""
    pos = [*args.posonlyargs, *args.args][1 if skip_self else 0 :]
    defaults = [None] * (len(pos) - len(args.defaults)) + list(args.defaults)
    out = [
        (a.arg, ast.unparse(a.annotation) if a.annotation else "any", _literal(d), d is not None)
        for a, d in zip(pos, defaults, strict=True)
        if a not in args.posonlyargs
    ]
    out += [
        (a.arg, ast.unparse(a.annotation) if a.annotation else "any", _literal(d), d is not None)
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return out


def _from_import(module: str, attr: str) -> tuple[list[tuple], bool, str]:
    import inspect
    from importlib import import_module

    obj = getattr(import_module(module), attr, None)
    if obj is None or not callable(obj):
        raise PluginError(f"{module}:{attr} is not a callable")
    sig = inspect.signature(obj)
    params = [
        (p.name, "any", None if p.default is p.empty else p.default, p.default is not p.empty)
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    return params, any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()), inspect.getdoc(obj) or ""


def import_path_plugin(kind: str, name: str, base_dir: str | None) -> Plugin:
    """The plug-in a study names by ``name`` (an import path), found from ``base_dir`` then
    ``sys.path``; ``PluginError`` (one line) where the module or the callable is missing, or the
    callable does not take what every builder of ``kind`` is given."""
    module, attr = name.split(":")
    with on_path(base_dir):
        path = module_file(module)
        if path is None:
            where = f"{base_dir} or sys.path" if base_dir else "sys.path"
            raise PluginError(f"{name}: module {module!r} not found (looked in {where})")
        found = _from_source(path, attr)
        if found is None:
            try:
                found = _from_import(module, attr)
            except PluginError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever the plug-in's import raises is its error
                raise PluginError(f"{name}: importing {module} failed: {type(exc).__name__}: {exc}") from None
    params, takes_any, doc = found
    fixed = FIXED_PARAMS.get(kind, ())
    have = {p[0] for p in params}
    missing = [f for f in fixed if f not in have]
    if missing and not takes_any:
        raise PluginError(
            f"{name}: the callable does not take {', '.join(missing)} (a {kind} builder is called with it)"
        )
    docs = _arg_docs(doc)
    options = tuple(
        Option(p, ann, default if has else None, None, docs.get(p, ""))
        for p, ann, default, has in params
        if p not in fixed
    )
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    return Plugin(
        kind=kind,
        name=name,
        target=name,
        options=options,
        origin=f"import path {name}",
        digest=file_digest(path),
        description="any options" if takes_any else "named options",
        doc=first,
        required=tuple(p for p, _, _, has in params if not has and p not in fixed + OFFERED_PARAMS.get(kind, ())),
    )
