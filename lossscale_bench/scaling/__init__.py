"""Loss-scaling methods behind one interface (``LossScaler``).

``build_scaler`` turns a study's scaling entry into a scaler by asking the method's entry
(:mod:`lossscale_bench.study.methods`) which class implements it and with which keyword
arguments; the per-layer methods also get the model (they scale per layer during backward)
and the precision's gradient format. A new method is its scaler module here and its entry
there; nothing in this file names a method.
"""

from __future__ import annotations

import inspect
from importlib import import_module
from typing import Any

from .base import DisabledLossScaler, LossScaler, StepResult

__all__ = ["DisabledLossScaler", "LossScaler", "StepResult", "build_scaler", "method_class", "scaler_class"]


def scaler_class(path: str) -> type[LossScaler]:
    """The class named ``module:Class`` (imported now: the per-layer scalers are heavy)."""
    module, _, name = path.partition(":")
    return getattr(import_module(module), name)


def __getattr__(name: str):
    """``from lossscale_bench.scaling import AdaptiveLossScaler``: any scaler class of this package,
    found in its modules (no list of methods here, and no pydantic needed: the GPU check's machine
    has none)."""
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        cls = getattr(import_module(f"{__name__}.{info.name}"), name, None)
        if isinstance(cls, type) and issubclass(cls, LossScaler):
            return cls
    raise AttributeError(name)


def _recipe_without_pydantic(entry: dict[str, Any]) -> tuple[str, dict, bool, bool]:
    """The recipe where the study layer cannot load (no pydantic: the bare GPU machine that runs
    ``benchmarks/gpu_check.py``): the scaler is the class whose ``method`` is the entry's, in the
    module named after it (``none`` lives with ``fixed``); every option given is passed on."""
    method = entry["method"]
    module = import_module(f"{__name__}.{'fixed' if method == 'none' else method}")
    cls = next(
        c
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, LossScaler) and c.__dict__.get("method") == method
    )
    params = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in entry.items() if k in params and k not in ("self", "model") and v is not None}
    return f"{module.__name__}:{cls.__name__}", kwargs, "model" in params, "grad_format" in params


def _recipe(entry: dict[str, Any]) -> tuple[str, dict, bool, bool]:
    try:
        from ..study.methods import ENTRIES, scaler_recipe
    except ImportError:  # pydantic missing: see _recipe_without_pydantic
        return _recipe_without_pydantic(entry)
    if entry.get("method") not in ENTRIES:
        raise ValueError(f"unknown scaling method {entry.get('method')!r}; allowed: {', '.join(ENTRIES)}")
    return scaler_recipe(entry)


def method_class(method: str) -> tuple[type[LossScaler], bool, bool]:
    """``(scaler class, per_layer, takes_grad_format)`` of a registered method (ValueError names an unknown one)."""
    path, _, per_layer, takes_format = _recipe({"method": method})
    return scaler_class(path), per_layer, takes_format


def build_scaler(entry: dict[str, Any], model=None, grad_format=None, **options: Any) -> LossScaler:
    """Build the scaler for a scaling entry (``{"method": ..., **options}``).

    ``grad_format`` is the precision's gradient format (:mod:`lossscale_bench.precision.formats`); the
    per-layer rules keep gradients inside its range (None: fp16, the methods' own format). ``options``:
    keyword arguments of the scaler's constructor beyond the entry's (``lossscale_bench.create_scaler``).
    """
    path, kwargs, per_layer, takes_format = _recipe(entry)
    cls = scaler_class(path)
    kwargs.update(options)
    if takes_format and grad_format is not None:
        kwargs["grad_format"] = grad_format
    return cls(model, **kwargs) if per_layer else cls(**kwargs)
