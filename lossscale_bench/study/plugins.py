"""Every plug-in a study may name, with the package's own registered (the registry's public view).

:mod:`lossscale_bench.core.plugins` is the mechanism; importing this module imports the modules that
describe the built-ins (``study/models/``, ``study/methods/``, ``study/precisions.py``,
``study/datasets.py``), so :func:`names` and :func:`entry` here see every one of them, and the
entry points installed distributions declare. Torch-free.

    from lossscale_bench.study import plugins
    plugins.names("model")                  # ('ssd300_resnet34', ..., 'ssd_tiny', <entry points>)
    plugins.entry("method", "adaptive")     # Plugin(name, target, options, display, version, origin, ...)
    plugins.entry("model", "mymodels:net", base_dir="studies")   # an import path, resolved
"""

from __future__ import annotations

from ..core import plugins as _mechanism
from ..core.plugins import KINDS, Plugin, PluginError, is_import_path
from . import datasets, methods, models, precisions  # noqa: F401 - registers the package's plug-ins
from .models import model_entry
from .models.signature import import_path_plugin

__all__ = ["entries", "entry", "listing", "names"]


def names(kind: str, *, entry_points: bool = True) -> tuple[str, ...]:
    """Every name of ``kind`` a study may use (``entry_points=False``: the package's own only)."""
    return _mechanism.names(kind, entry_points=entry_points)


def entry(kind: str, name: str, base_dir: str | None = None) -> Plugin:
    """The plug-in ``name`` of ``kind``; a model or data set named by import path is resolved against
    ``base_dir``."""
    if kind == "model" and is_import_path(name):
        return model_entry(name, base_dir)
    if kind == "dataset" and is_import_path(name) and name not in names("dataset"):
        return import_path_plugin("dataset", name, base_dir)
    return _mechanism.entry(kind, name)


def entries(kind: str) -> tuple[Plugin, ...]:
    """Every plug-in of ``kind``, entry points loaded (one that cannot be loaded raises PluginError)."""
    return tuple(entry(kind, n) for n in names(kind))


def listing() -> list[tuple[str, str, str, str]]:
    """``(kind, name, origin, digest or problem)`` of every registered plug-in, kind by kind (``lsbench
    plugins``); an entry point that cannot be loaded is listed with why."""
    rows = []
    for kind in KINDS:
        for name in names(kind):
            try:
                p = entry(kind, name)
            except PluginError as exc:
                rows.append((kind, name, "entry point (not loadable)", str(exc)))
                continue
            rows.append((kind, name, p.origin, p.digest or ""))
    return rows
