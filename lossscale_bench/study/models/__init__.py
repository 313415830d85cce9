"""Detectors as a study file names them: the package's models described torch-free, and models from
outside the package (an import path ``package.module:callable``, or an installed distribution's entry
point in the group ``lossscale_bench.models``).

A model is one :func:`register_model` call in a module of this package (``ssd.py`` describes the SSDs
of ``lossscale_bench/models/ssd.py``): its name, its builder's import path, its options with their
docs, its display name and its version. The module is found and imported on its own (no list names
it). ``lossscale_bench.models.build_model`` builds any name from its entry, or an import path.

A builder is called as ``builder(num_classes=N, **model_options)`` and returns a module with
torchvision's detection interface (``model(images, targets)`` -> dict of losses in training,
``model(images)`` -> list of ``{"boxes", "labels", "scores"}`` in eval).
"""

from __future__ import annotations

import pkgutil
from importlib import import_module

from ...core import plugins
from ...core.plugins import Option, Plugin, PluginError, is_import_path
from .signature import import_path_plugin

__all__ = ["model_entry", "model_option_problems", "model_names", "register_model"]


def register_model(name: str, target: str, *, options: tuple[Option, ...] = (), **fields) -> Plugin:
    """Describe a built-in model once (see the module doc); ``fields``: display, version, doc."""
    return plugins.register("model", name, target, options=options, **fields)


def model_names() -> tuple[str, ...]:
    """Every model name a study may use (the package's, then the entry points')."""
    return plugins.names("model")


def model_entry(name: str, base_dir: str | None = None) -> Plugin:
    """The plug-in behind a study's ``model`` value: a registered name, an entry point, or an import
    path resolved against ``base_dir`` (the study file's folder) and then ``sys.path``."""
    if is_import_path(name) and name not in plugins.names("model"):
        return import_path_plugin("model", name, base_dir)
    return plugins.entry("model", name)


def model_option_problems(plugin: Plugin, given: dict) -> list[tuple[str, str]]:
    """``(key, problem)`` for each option in ``given`` that ``plugin``'s builder does not take."""
    if plugin.description == "any options":  # a builder with **kwargs takes every key
        return []
    known = [o.name for o in plugin.options]
    return [
        (k, f"not an option of {plugin.name}; its options: {', '.join(known) or 'none'}")
        for k in given
        if k not in known
    ]


def _describe_entry_point(name: str, target: str, origin: str) -> Plugin:
    """An entry point of ``lossscale_bench.models``: its value is the builder's import path."""
    p = import_path_plugin("model", target, None)
    return Plugin(
        kind="model", name=name, target=target, options=p.options, origin=origin, description=p.description, doc=p.doc
    )


plugins.DESCRIBERS["model"] = _describe_entry_point
for _info in pkgutil.iter_modules(__path__):
    if _info.name != "signature":
        import_module(f".{_info.name}", __name__)
if not plugins.names("model", entry_points=False):  # pragma: no cover - a broken install
    raise PluginError("no built-in model registered (lossscale_bench/study/models/)")
