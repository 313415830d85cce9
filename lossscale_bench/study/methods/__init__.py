"""Loss-scaling methods as a study file names them: one module per method, each one entry.

Adding a method: its scaler in ``lossscale_bench/scaling/`` (a per-layer one subclasses
``scaling/per_layer/scaler.py``'s ``PointLossScaler`` or ``PerLayerLossScaler``) and its entry here
(a module of this package with a :class:`~.base.MethodEntry` subclass under ``@register_method``),
or both in a distribution of its own that names the entry class in the entry-point group
``lossscale_bench.methods`` (docs/development/extending.md has both, run by
``tests/test_extending.py``). The modules here are found and imported on their own; entry points
are loaded when this package is first imported (the schema's union needs their classes). Everything
else (the schema's union, trial-id tags, default labels, the report's labels of stored runs,
``build_scaler``, ``report --telemetry``) reads the registered entries and the scalers' metrics.
"""

from __future__ import annotations

import pkgutil
from importlib import import_module
from typing import Annotated, Union

from pydantic import Discriminator

from ...core import plugins
from ..precisions import PRECISION_OPTIONS, precision_option_words
from .base import COMMON_KEYS, Fail, MethodEntry, ResourcesOverride, method_plugin, register_method


def _describe_entry_point(name: str, target: str, origin: str) -> plugins.Plugin:
    """An entry point of ``lossscale_bench.methods``: its value names a ``MethodEntry`` subclass."""
    module, attr = target.split(":")
    try:
        cls = getattr(import_module(module), attr)
    except Exception as exc:  # noqa: BLE001 - whatever the plug-in's import raises is its error
        raise plugins.PluginError(f"method {name!r} ({origin}): cannot load {target}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, MethodEntry)):
        raise plugins.PluginError(f"method {name!r} ({origin}): {target} is not a MethodEntry subclass")
    return method_plugin(cls, name, origin)


plugins.DESCRIBERS["method"] = _describe_entry_point
for _info in pkgutil.iter_modules(__path__):
    if _info.name != "base":
        import_module(f".{_info.name}", __name__)


#: every scaling method a study may name: the package's (its modules in name order), then the entry
#: points' (their names read from the installed metadata; their entries loaded when first needed)
METHOD_NAMES = plugins.names("method")
_ENTRIES: dict[str, type[MethodEntry]] = {}


def entries() -> dict[str, type[MethodEntry]]:
    """method name -> its entry class (also as ``ENTRIES``); entry points loaded on the first call (a
    broken one is left out here and named by ``lsbench plugins``), late so that a plug-in's module may
    import the study layer."""
    return plugins.load_descriptions("method", METHOD_NAMES, _ENTRIES)


def __getattr__(name: str):
    """``ENTRIES`` and ``ScalingEntry`` (one ``scaling:`` entry, told apart by ``method``), computed when
    first read (PEP 562)."""
    if name == "ENTRIES":
        return entries()
    if name == "ScalingEntry":
        return Annotated[Union[tuple(entries().values())], Discriminator("method")]  # type: ignore[valid-type]  # noqa: UP007 (a tuple of types: only Union[...] takes one)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def entry_of(scaling: dict) -> type[MethodEntry]:
    """The entry class of a normalized scaling dict; ``KeyError`` names an unknown method."""
    return entries()[scaling.get("method")]  # type: ignore[index]


def scaling_tag(scaling: dict) -> str:
    """The readable part of a trial id for this scaling (``fixed128``, ``adaptive-f10``)."""
    method = scaling.get("method")
    return entries()[method].id_tag(scaling) if method in entries() else str(method)


def default_label(scaling: dict, precision: str) -> str:
    """The published table's wording for a scaling entry (options missing from ``scaling`` take defaults).

    Common options that make a row of their own are said after the method's words.
    """
    if scaling.get("grad_rounding") == "after_unscale":  # Chainer's order (precision/runtime.py): its own row
        rest = {k: v for k, v in scaling.items() if k != "grad_rounding"}
        return f"{default_label(rest, precision)} (grads rounded after unscale)"
    blocks = scaling.get("grad_blocks")
    if blocks not in (None, "none"):
        rest = {k: v for k, v in scaling.items() if k not in ("grad_blocks", "block_rounding")}
        how = {
            "tensor": "per-tensor scaled",
            "tile128": "1x128-tile scaled",
            "mx32": f"MX32 block scaled, {scaling.get('block_rounding', 'ceil')}",
        }[blocks]
        return f"{default_label(rest, precision)} ({how} grads)"
    words = precision_option_words(scaling)
    if words:
        rest = {k: v for k, v in scaling.items() if k not in PRECISION_OPTIONS}
        return f"{default_label(rest, precision)} ({', '.join(words)})"
    if scaling.get("grad_overflow") == "nan":
        rest = {k: v for k, v in scaling.items() if k != "grad_overflow"}
        return f"{default_label(rest, precision)} (grad overflow -> NaN)"
    method = scaling.get("method")
    return entries()[method].row_label(scaling, precision) if method in entries() else str(method)


def scaling_keys(method: str) -> list[str]:
    """Every key a ``method`` entry accepts, common keys first (for "unknown key" errors)."""
    return list(COMMON_KEYS) + entries()[method].option_names()


def scaler_recipe(scaling: dict) -> tuple[str, dict, bool, bool]:
    """``(module:Class, constructor keyword arguments, per_layer, takes_grad_format)`` for a
    normalized scaling dict."""
    entry = entry_of(scaling)
    return entry.scaler, entry.scaler_kwargs(scaling), entry.per_layer, entry.per_layer or entry.takes_grad_format


__all__ = [
    "ENTRIES",
    "METHOD_NAMES",
    "entries",
    "register_method",
    "ScalingEntry",
    "MethodEntry",
    "ResourcesOverride",
    "Fail",
    "entry_of",
    "scaling_tag",
    "default_label",
    "scaling_keys",
    "scaler_recipe",
]
