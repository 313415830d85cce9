"""What every scaling entry of a study file has, and what each method must say about itself.

A method describes itself once, in its own module of this package: its study-file
options with their defaults (the pydantic fields), what of them enters the trial id
(:meth:`MethodEntry.normalized`), its short id tag and its report label (computed from
the normalized dict, so the report can label stored runs the same way), the scaler class
that implements it and the keyword arguments that class takes, and the option
combinations it refuses. The grid, the schema, ``build_scaler`` and the report all ask
the entry; none of them spells a method out.

Torch-free (the study layer): the scaler is named by its import path, imported only by
``lossscale_bench.scaling.build_scaler``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, ClassVar, get_args

from pydantic import BaseModel, create_model

from ...core import plugins
from ...core.registry import BACKEND_NAMES
from ..described import field_options
from ..errors import fmt_num
from ..fields import STRICT, Bool, Label, PosFloat, PosInt, choice_field, model_field
from ..precisions import GRAD_ROUNDINGS, PRECISION_NAMES, PRECISION_OPTIONS

#: ``fail(path_suffix, problem, allowed=None)``: raise the study error for ``scaling[k]<path_suffix>``
Fail = Callable[..., None]

#: keys every entry has that are not options of the method (grid axes, report settings)
COMMON_KEYS = (
    "method",
    "label",
    "precision",
    "model",
    "batch_size",
    "resources",
    "baseline",
    "grad_rounding",
    "grad_overflow",
    "grad_blocks",
    "block_rounding",
    *PRECISION_OPTIONS,
)
#: the gradient-format options of the emulated FP8 precisions, with their defaults (the trial id
#: carries one only when it is not at its default, so earlier trials keep their ids)
GRAD_FORMAT_DEFAULTS = {"grad_overflow": "saturate", "grad_blocks": "none", "block_rounding": "ceil"}


class ResourcesOverride(BaseModel):
    """A scaling entry's own resources (a study may mix backends: GPU rows next to Gaudi rows)."""

    model_config = STRICT

    backend: choice_field("backend", BACKEND_NAMES) | None = None  # type: ignore[valid-type]
    devices_per_trial: PosInt | None = None  # type: ignore[valid-type]
    cpus_per_trial: PosFloat | None = None  # type: ignore[valid-type]

    def given(self) -> dict:
        return {k: v for k, v in self.model_dump(mode="json").items() if v is not None}


def num(x: Any) -> str:
    """A number as a label or id shows it (``128``, ``0.5``)."""
    return fmt_num(float(x)) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def differs(scaling: dict, key: str, default: Any) -> bool:
    """Whether ``scaling`` gives ``key`` a value other than ``default`` (numbers compared as floats)."""
    v = scaling.get(key)
    if v is None:
        return False
    if isinstance(default, (int, float)) and not isinstance(default, bool) and not isinstance(v, bool):
        return float(v) != float(default)
    return v != default


def option_parts(scaling: dict, defaults: dict, shorts) -> list[str]:
    """``short=value`` for each ``(key, short)`` whose value differs from ``defaults`` (a default
    missing or None: given at all): the label words every method shares."""
    return [f"{short}={num(scaling[key])}" for key, short in shorts if differs(scaling, key, defaults.get(key))]


def interval_label(title: str, scaling: dict, defaults: dict, shorts) -> str:
    """``title (interval=N, short=value, ...)``: the label of a method that grows its scale every
    ``interval`` clean steps (always shown), with the options that differ from ``defaults``."""
    parts = [f"interval={num(scaling.get('interval', defaults['interval']))}", *option_parts(scaling, defaults, shorts)]
    return f"{title} ({', '.join(parts)})"


def _option_field(choices: tuple, name: str):
    return (Bool if all(isinstance(c, bool) for c in choices) else choice_field(name, choices)) | None  # type: ignore


#: the precision options (``study.precisions.PRECISION_OPTIONS``) as fields every entry has, None: not given
_PrecisionOptionFields = create_model(
    "_PrecisionOptionFields",
    __base__=BaseModel,
    **{n: (_option_field(o.choices, n), None) for n, o in PRECISION_OPTIONS.items()},
)


class MethodEntry(_PrecisionOptionFields):
    """One ``scaling:`` entry. A subclass per method sets ``method: Literal[...]`` and the class
    attributes below, and overrides :meth:`id_tag`, :meth:`row_label` (and, where needed,
    :meth:`normalized`, :meth:`scaler_kwargs`, :meth:`check`)."""

    model_config = STRICT

    #: ``module:Class`` of the scaler, imported only when a trial builds it
    scaler: ClassVar[str] = ""
    #: per-layer scalers take the model (positional) and the precision's gradient format
    per_layer: ClassVar[bool] = False
    #: a global scaler that still needs the gradient format (its maximum, its range)
    takes_grad_format: ClassVar[bool] = False
    #: bumped (start at 2) when the scaler's code changes what a trial trains to: only this method's
    #: trial ids change (None: never bumped)
    version: ClassVar[int | None] = None

    label: Label = None
    precision: choice_field("precision", PRECISION_NAMES) | None = None  # type: ignore[valid-type]
    model: model_field() | None = None  # type: ignore[valid-type]
    batch_size: PosInt | None = None  # type: ignore[valid-type]
    resources: ResourcesOverride | None = None
    #: the report's reference row (its test of every other row); not in the trial id
    baseline: Bool = False
    #: emulated precisions: parameter gradients rounded before (default, PyTorch AMP) or after
    #: unscaling (Chainer's order); precision/runtime.py's module doc. A trial option, so it lives here.
    grad_rounding: choice_field("grad_rounding", GRAD_ROUNDINGS) | None = None  # type: ignore
    #: E4M3 gradients only: an overflow saturates to +-448 (torch's cast, TE) or becomes NaN (OCP's
    #: non-saturating conversion), which overflow-driven scalers can see
    grad_overflow: choice_field("grad_overflow", ("saturate", "nan")) | None = None  # type: ignore
    #: emulated FP8 gradients scaled per block before the cast (formats.BlockScaledFormat)
    grad_blocks: choice_field("grad_blocks", ("none", "tensor", "tile128", "mx32")) | None = None  # type: ignore
    #: grad_blocks mx32 only: rounding of the shared power-of-two exponent
    block_rounding: choice_field("block_rounding", ("floor", "ceil", "even", "rceil")) | None = None  # type: ignore

    # -- identity --------------------------------------------------------------------------
    @classmethod
    def option_names(cls) -> list[str]:
        """The method's own options, in declaration order."""
        return [k for k in cls.model_fields if k not in COMMON_KEYS]

    def options(self) -> dict:
        """``{"method": ..., every option with defaults filled}``."""
        return {"method": self.method, **{k: getattr(self, k) for k in self.option_names()}}  # type: ignore

    def normalized(self) -> dict:
        """What enters the trial id: :meth:`options` (a method may leave out late options at
        their default so existing ids stay) and the common options when not at their default."""
        return {**self.options(), **self.common_options()}

    def common_options(self) -> dict:
        """``before_unscale`` is the default: such an entry is the same trial as one without; the
        same for the gradient-format and precision options at their defaults (block_rounding only with mx32)."""
        out = {"grad_rounding": self.grad_rounding} if self.grad_rounding == "after_unscale" else {}
        defaults = {**GRAD_FORMAT_DEFAULTS, **{n: o.default for n, o in PRECISION_OPTIONS.items()}}
        for key, default in defaults.items():
            v = getattr(self, key)
            if v is not None and v != default and (key != "block_rounding" or self.grad_blocks == "mx32"):
                out[key] = v
        return out

    def overrides(self) -> dict:
        return {k: getattr(self, k) for k in ("precision", "model", "batch_size") if getattr(self, k) is not None}

    # -- described from a normalized dict (also a stored run's params) ----------------------
    @classmethod
    def id_tag(cls, scaling: dict) -> str:
        """The readable part of a trial id (``fixed128``, ``dyn10``)."""
        return str(scaling.get("method"))

    @classmethod
    def row_label(cls, scaling: dict, precision: str) -> str:
        """The published tables' wording for the row (options missing from ``scaling`` take defaults)."""
        return str(scaling.get("method"))

    @classmethod
    def scaler_kwargs(cls, scaling: dict) -> dict:
        """Keyword arguments of the scaler's constructor: the given options, ``None`` left out
        (the constructor's own default then applies; ``test_methods`` checks they agree)."""
        return {k: scaling[k] for k in cls.option_names() if scaling.get(k) is not None}

    # -- validation ----------------------------------------------------------------------
    def check(self, fail: Fail, precision: str) -> None:
        """Refuse option combinations that cannot mean what they say (``fail(".opt", problem)``) in
        ``precision`` (the entry's own or the study's), whose formats bound some of them. A bound that
        holds whatever the precision belongs on the option's type (``fields.Scale``)."""


def method_plugin(cls: type[MethodEntry], name: str | None = None, origin: str = plugins.BUILT_IN) -> plugins.Plugin:
    """The registry's description of the method entry ``cls`` (its name: the ``method`` literal)."""
    method = get_args(cls.model_fields["method"].annotation)[0]
    if name is not None and name != method:
        raise plugins.PluginError(f"method {name!r} ({origin}): its entry says method: {method!r}")
    doc = (sys.modules[cls.__module__].__doc__ or cls.__doc__ or "").strip().splitlines()
    return plugins.Plugin(
        kind="method",
        name=method,
        target=cls.scaler,
        options=field_options(cls, cls.option_names()),
        version=cls.version,
        origin=origin,
        description=cls,
        doc=doc[0] if doc else "",
    )


def register_method(cls: type[MethodEntry]) -> type[MethodEntry]:
    """Class decorator: register the method entry ``cls`` (``@register_method`` above the class)."""
    p = method_plugin(cls)
    plugins.register("method", p.name, p.target, options=p.options, version=p.version, description=cls, doc=p.doc)
    return cls
