"""Loss-scaling methods as a study file names them: one module per method, each one entry.

Adding a method: its scaler in ``lossscale_bench/scaling/`` (a per-layer one subclasses
``scaling/per_layer/scaler.py``'s ``PointLossScaler`` or ``PerLayerLossScaler``), its entry here (a module
named after the method that defines ``ENTRY``, a :class:`~.base.MethodEntry` subclass), and its
name in ``registry.SCALING_METHODS`` (README "Adding a method or a precision" has a worked example,
run by ``tests/test_extending.py``). Everything else (the schema's union, trial-id tags, default
labels, the report's labels of stored runs, ``build_scaler``, ``report --telemetry``) reads the
entries and the scalers' metrics.
"""

from __future__ import annotations

from importlib import import_module
from typing import Annotated, Union

from pydantic import Discriminator

from ...core.registry import SCALING_METHODS
from ..precisions import PRECISION_OPTIONS, precision_option_words
from .base import COMMON_KEYS, Fail, MethodEntry, ResourcesOverride

#: method name -> its entry class, in the registry's order
ENTRIES: dict[str, type[MethodEntry]] = {m: import_module(f".{m}", __name__).ENTRY for m in SCALING_METHODS}

#: one ``scaling:`` entry, told apart by ``method``
ScalingEntry = Annotated[Union[tuple(ENTRIES.values())], Discriminator("method")]  # type: ignore[valid-type]  # noqa: UP007 (a tuple of types: only Union[...] takes one)


def entry_of(scaling: dict) -> type[MethodEntry]:
    """The entry class of a normalized scaling dict; ``KeyError`` names an unknown method."""
    return ENTRIES[scaling.get("method")]  # type: ignore[index]


def scaling_tag(scaling: dict) -> str:
    """The readable part of a trial id for this scaling (``fixed128``, ``adaptive-f10``)."""
    method = scaling.get("method")
    return ENTRIES[method].id_tag(scaling) if method in ENTRIES else str(method)


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
    return ENTRIES[method].row_label(scaling, precision) if method in ENTRIES else str(method)


def scaling_keys(method: str) -> list[str]:
    """Every key a ``method`` entry accepts, common keys first (for "unknown key" errors)."""
    return list(COMMON_KEYS) + ENTRIES[method].option_names()


def scaler_recipe(scaling: dict) -> tuple[str, dict, bool, bool]:
    """``(module:Class, constructor keyword arguments, per_layer, takes_grad_format)`` for a
    normalized scaling dict."""
    entry = entry_of(scaling)
    return entry.scaler, entry.scaler_kwargs(scaling), entry.per_layer, entry.per_layer or entry.takes_grad_format


__all__ = [
    "ENTRIES",
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
