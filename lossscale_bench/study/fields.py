"""Field types of the study schema: pydantic's own constraints, worded for the user.

Ranges, choices, booleans, non-blank strings and non-empty lists are pydantic
constraints (``Field(ge=...)``, ``Literal``, ``StrictBool``, ``pattern``,
``min_length``), so the JSON schema shows them. Where the message needs
something pydantic does not know (the allowed range as a whole, the noun of a
choice, a close match), a wrap validator words pydantic's failure; the
wording of the other constraints is in :func:`~.load._convert`. What is left
hand-written is what pydantic does not do: YAML 1.1 reads ``1e-3`` (no dot)
as a string, and a number must not be given as ``true``.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    WrapValidator,
)

from ..core.float_ranges import FP32
from ..core.plugins import is_import_path
from ..core.wording import suggest
from .as_written import AsWritten
from .errors import field_error, fmt_num, show_value

__all__ = [
    "DEFAULT_SOURCE",
    "NOT_BLANK",
    "STRICT",
    "as_list",
    "Bool",
    "choice_field",
    "ctx_base_dir",
    "ctx_source",
    "Label",
    "ListOf",
    "model_field",
    "mapping_or_empty",
    "NonNegInt",
    "number_field",
    "OptStr",
    "PosFloat",
    "PosInt",
    "resolve_path",
    "Scale",
    "Str",
]

DEFAULT_SOURCE = "<string>"
#: "not blank": the pattern of :data:`Str` (load.py words its mismatch as "must not be empty");
#: a character ``str.strip()`` keeps (it also strips the separators \x1c-\x1f, which ``\s`` lacks)
NOT_BLANK = r"[^\s\x1c-\x1f]"

STRICT = ConfigDict(extra="forbid", frozen=True, validate_default=False)


# --------------------------------------------------------------------------- validation context


def ctx_source(info: ValidationInfo | None) -> str:
    """The name of the study file being validated, for its messages."""
    ctx = getattr(info, "context", None) or {}
    return str(ctx.get("source", DEFAULT_SOURCE))


def ctx_base_dir(info: ValidationInfo | None) -> str:
    """The folder relative paths of the study file resolve against (its own; else the cwd)."""
    ctx = getattr(info, "context", None) or {}
    return str(ctx.get("base_dir") or os.getcwd())


def resolve_path(p: str, base_dir: str) -> str:
    """``p`` with ``~`` expanded, made absolute against ``base_dir``, normalised."""
    p = os.path.expanduser(p)
    if not os.path.isabs(p):
        p = os.path.join(base_dir, p)
    return os.path.normpath(p)


# --------------------------------------------------------------------------- numbers


def _range_text(kind: str, gt=None, ge=None, lt=None, le=None, nullable=False) -> str:
    noun = "integers" if kind == "int" else "numbers"
    lo = f"{fmt_num(gt)} < " if gt is not None else (f"{fmt_num(ge)} <= " if ge is not None else "")
    hi = f" < {fmt_num(lt)}" if lt is not None else (f" <= {fmt_num(le)}" if le is not None else "")
    if lo and hi:
        text = f"{noun} {lo}x{hi}"
    elif lo:
        op = lo.split()[1]
        text = f"{noun} {'>' if op == '<' else '>='} {lo.split()[0]}"
    elif hi:
        text = f"{noun}{hi}"
    else:
        text = noun
    return text + (" or null" if nullable else "")


_OUT_OF_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def number_field(kind: str, *, gt=None, ge=None, lt=None, le=None, nullable: bool = False, why: str | None = None):
    """An ``int``/``float`` with pydantic's bounds (and no inf/nan); failures say the whole range
    (and ``why`` it is that range, where the bounds come from somewhere the user should know)."""
    allowed = _range_text(kind, gt, ge, lt, le, nullable) + (f" ({why})" if why else "")
    expected = "an integer" if kind == "int" else "a number"
    bounds = {"gt": gt, "ge": ge, "lt": lt, "le": le}
    base = Annotated[int, Field(**bounds)] if kind == "int" else Annotated[float, Field(**bounds, allow_inf_nan=False)]

    def check(v: Any, handler):
        orig = v
        if isinstance(v, bool):  # pydantic would take true for 1
            raise field_error(f"expected {expected}, got {show_value(v)}", allowed)
        if isinstance(v, str):  # YAML reads 1e-3 (no dot) as a string; pydantic's int would refuse '1e3'
            try:
                v = float(v.strip())
            except ValueError:
                raise field_error(f"expected {expected}, got {show_value(orig)}", allowed) from None
        if kind == "int" and isinstance(v, float) and v.is_integer():
            v = int(v)  # pydantic's int refuses floats past 64 bits (1.0e20)
        try:
            return handler(v)
        except ValidationError as exc:
            etype = exc.errors()[0]["type"]
            if etype in _OUT_OF_RANGE:
                problem = f"{show_value(orig)} is out of range"
            elif etype == "finite_number":
                problem = f"expected a finite number, got {show_value(orig)}"
            else:  # int_type, float_type, int_from_float, ...
                problem = f"expected {expected}, got {show_value(orig)}"
            raise field_error(problem, allowed) from None

    return Annotated[base | None if nullable else base, WrapValidator(check)]  # type: ignore[valid-type]


# --------------------------------------------------------------------------- choices, booleans, strings


def choice_field(kind: str, names):
    """``Literal[names]``; a failure names the kind, the closest name and every name."""
    names = tuple(names)

    def check(v: Any, handler):
        try:
            return handler(v)
        except ValidationError:
            if not isinstance(v, str) and str(v).lower() in {str(n).lower() for n in names}:
                # `.nan`, `yes`, `1e3`: YAML read a number or a boolean where a name was meant
                raise field_error(
                    f"YAML reads this value as the {type(v).__name__} {show_value(v)}, not as a name; "
                    f'write it in quotes ({kind}: "{str(v).lower()}")',
                    ", ".join(names),
                ) from None
            raise field_error(f"unknown {kind} {show_value(v)}{suggest(v, names)}", ", ".join(names)) from None

    return Annotated[Literal[names], WrapValidator(check)]  # type: ignore[valid-type]


def model_field():
    """A detector: a registered model name (read when the value is checked, so entry points count) or
    an import path ``package.module:callable`` (found and checked by the study, which knows its folder)."""
    from ..core.plugins import names

    def check(v: Any, handler):
        v = handler(v)
        known = names("model")
        if v in known or is_import_path(v):
            return v
        raise field_error(
            f"unknown model {show_value(v)}{suggest(v, known)}", ", ".join(known) + " or package.module:callable"
        )

    return Annotated[StrictStr, WrapValidator(check)]


def _numbers_as_text(v: Any):
    """A label may be a number (``label: 128``); it reads as written (``1.10`` stays ``1.10``)."""
    if isinstance(v, AsWritten):
        return str(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt_num(v)
    return v


def _one_spaced(v: Any):
    """A label as every report shows it: runs of white space (line breaks too) as one space, none at the ends.

    The markdown table turns a line break into a space, so ``"a\\nb"`` and ``"a b"``, or
    ``"x"`` and ``"x "``, printed alike with different numbers: normalised here, before the
    study's duplicate-label check compares them, they are one label (and refused as such).
    """
    return " ".join(v.split()) if isinstance(v, str) else v


def as_list(v: Any):
    """A scalar where a list is expected becomes a one-element list; nothing becomes ``[]``."""
    if v is None:
        return []
    if isinstance(v, (str, int, float, bool)):
        return [v]
    if isinstance(v, tuple):
        return list(v)
    return v


def mapping_or_empty(v: Any):
    """Optional sections: ``eval:`` with nothing after it means defaults."""
    return {} if v is None else v


#: true or false only (pydantic's lax bool would take 1 or 'on'); load.py words ``bool_type``
Bool = StrictBool
#: a string with something in it (kept as written, not stripped)
Str = Annotated[str, Field(strict=True, pattern=NOT_BLANK)]
OptStr = Str | None
Label = Annotated[Str | None, AfterValidator(_one_spaced), BeforeValidator(_numbers_as_text)]
PosInt = number_field("int", ge=1)
NonNegInt = number_field("int", ge=0)
PosFloat = number_field("float", gt=0)
#: a loss scale, or a bound on one. The scalers keep scales as fp32 numbers, and the divergence rule
#: calls a scale below fp32's smallest normal collapsed (``engine.hooks.SCALE_FLOOR``): a value outside
#: fp32's normal range cannot be the scale the entry's label names (past fp32's largest value every
#: step overflows, and the per-layer scalers cannot even build their fp32 scale tensors)
Scale = number_field("float", ge=FP32.min_normal, le=FP32.max, why="fp32's normal range, where loss scales are kept")


def ListOf(item, *, nonempty: bool = True):  # noqa: N802 - a type constructor
    """A list of ``item`` that may be written as one scalar; empty is refused unless ``nonempty=False``."""
    if nonempty:
        return Annotated[list[item], Field(min_length=1), BeforeValidator(as_list)]  # type: ignore[valid-type]
    return Annotated[list[item], BeforeValidator(as_list)]  # type: ignore[valid-type]
