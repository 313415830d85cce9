"""A pydantic description (a method entry, a data set's schema) as the registry's options.

Each field becomes a :class:`~lossscale_bench.core.plugins.Option`: its type and allowed values from
the annotation, its default, and its doc from the ``#:`` comment above it in the class (or a base
class): the one place an option is described, read by the registry, ``lsbench plugins`` and the
reference pages alike.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Annotated, Literal, Union, get_args, get_origin

from ..core.plugins import Option

__all__ = ["comment_docs", "field_docs", "field_options"]


def comment_docs(lines: list[str]) -> dict[str, str]:
    """name -> its ``#:`` comment block, for ``name: ...`` and ``name = ...`` lines."""
    docs, block = {}, []
    for line in lines:
        s = line.strip()
        if s.startswith("#:"):
            block.append(s[2:].strip())
            continue
        m = re.match(r"([A-Za-z_]\w*)\s*(?::|=)", s)
        if m and block:
            docs[m.group(1)] = " ".join(block)
        block = []
    return docs


def field_docs(cls) -> dict[str, str]:
    """``#:`` comments above the fields of ``cls`` and its bases in the package (the nearest class wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(inspect.getmro(cls)):
        if not getattr(klass, "__module__", "").startswith("lossscale_bench") and klass is not cls:
            continue
        try:
            docs.update(comment_docs(inspect.getsource(klass).splitlines()))
        except (OSError, TypeError):
            continue
    return docs


_TYPE_WORDS = {bool: "bool", int: "int", float: "float", str: "str"}


def _type_of(annotation) -> tuple[str, tuple | None]:
    """``(type in words, allowed values or None)`` of a field's annotation."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _type_of(get_args(annotation)[0])
    if origin is Literal:
        return "choice", get_args(annotation)
    if origin in (Union, types.UnionType):
        parts = [a for a in get_args(annotation) if a is not type(None)]
        return _type_of(parts[0]) if len(parts) == 1 else (" or ".join(_type_of(a)[0] for a in parts), None)
    if origin in (list, tuple, typing.Sequence):
        return f"list of {_type_of(get_args(annotation)[0])[0]}" if get_args(annotation) else "list", None
    return _TYPE_WORDS.get(annotation, getattr(annotation, "__name__", "any")), None


def field_options(cls, keys) -> tuple[Option, ...]:
    """The registry's options of the pydantic model ``cls``'s fields ``keys``."""
    docs = field_docs(cls)
    out = []
    for k in keys:
        info = cls.model_fields[k]
        kind, allowed = _type_of(info.annotation)
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        out.append(Option(k, kind, default, allowed, docs.get(k, "")))
    return tuple(out)
