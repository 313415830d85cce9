"""Reading a study: YAML (duplicate keys refused), validation, one-line errors.

Every problem becomes a :class:`StudyError` naming the file, the field path
and, where there is one, what is allowed; pydantic's own messages are never
shown (:func:`_convert` words each kind of failure).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import ValidationError

from ..registry import DATASET_NAMES, SCALING_METHODS
from .errors import ERROR_TYPE, StudyError, _show, _suggest
from .fields import _DEFAULT_SOURCE, NOT_BLANK
from .schema import _SECTION_MODELS, DATASET_MODELS, Study, _scaling_keys


# --------------------------------------------------------------------------- YAML


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (the later one would silently win)."""


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue  # SafeLoader reports unhashable keys itself
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_error(source: str, exc: yaml.YAMLError) -> StudyError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"invalid YAML: {problem}" + (f" ({context})" if context else "")
    return StudyError(source, where, text)


def _str_keys(v: Any):
    """YAML allows keys like ``1`` or ``yes`` (true); make them strings so they are named as unknown keys."""
    if isinstance(v, dict):
        return {(k if isinstance(k, str) else _show(k)): _str_keys(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_str_keys(x) for x in v]
    return v


# --------------------------------------------------------------------------- pydantic errors -> StudyError


def _clean_loc(loc: tuple, raw: Any) -> tuple[list, Optional[tuple]]:
    """Drop pydantic's union tags and the index of scalar-wrapped lists; return (loc, tag model key)."""
    loc = list(loc)
    tag = None
    if loc[:1] == ["dataset"] and len(loc) > 1 and loc[1] in DATASET_NAMES:
        tag = ("dataset", loc.pop(1))
    elif loc[:1] == ["scaling"] and len(loc) > 2 and isinstance(loc[1], int) and loc[2] in SCALING_METHODS:
        tag = ("scaling", loc.pop(2))
    out: list = []
    node = raw
    for seg in loc:
        if isinstance(seg, int):
            if isinstance(node, list):
                node = node[seg] if 0 <= seg < len(node) else None
                out.append(seg)
            # else: the user wrote a scalar that we wrapped; no index to show
            continue
        node = node.get(seg) if isinstance(node, dict) else None
        out.append(seg)
    return out, tag


def _path_text(loc: list) -> str:
    s = ""
    for seg in loc:
        if isinstance(seg, int):
            s += f"[{seg}]"
        else:
            s += ("." if s else "") + str(seg)
    return s


def _allowed_keys(parent: list, tag) -> list[str]:
    if not parent:
        return [k for k in Study.model_fields if k != "source"]
    if tag and tag[0] == "scaling":
        return _scaling_keys(tag[1])
    if tag and tag[0] == "dataset":
        return list(DATASET_MODELS[tag[1]].model_fields)
    model = _SECTION_MODELS.get(parent[0])
    return list(model.model_fields) if model else []


_TYPE_WORDS = {
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "list_type": "a list", "string_type": "a string", "int_type": "an integer", "int_parsing": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
}
#: what a constraint allows, where its failure alone says it (StrictBool)
_TYPE_ALLOWED = {"bool_type": "true, false"}


def _convert(source: str, exc: ValidationError, raw: Any) -> StudyError:
    errors = exc.errors(include_url=False)
    # an unknown key usually explains a 'missing' one (a typo): report it first
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc, tag = _clean_loc(tuple(first["loc"]), raw)
    etype = first["type"]
    ctx = first.get("ctx") or {}
    inp = first.get("input")
    allowed = None
    if etype == ERROR_TYPE:  # worded by the field's own validator (fields.py)
        problem, allowed = ctx["problem"], ctx.get("allowed")
    elif etype == "extra_forbidden":
        keys = _allowed_keys(loc[:-1], tag)
        problem = f"unknown key{_suggest(loc[-1], keys)}"
        allowed = ", ".join(keys)
    elif etype == "missing":
        problem = "required key missing"
    elif etype in ("union_tag_invalid", "union_tag_not_found"):
        key, names, kind = (("method", SCALING_METHODS, "scaling method") if loc[:1] == ["scaling"]
                            else ("name", DATASET_NAMES, "dataset"))
        loc = loc + [key]
        allowed = ", ".join(names)
        if etype == "union_tag_not_found":
            problem = "required key missing"
        else:
            t = ctx.get("tag")
            problem = f"unknown {kind} {t!r}{_suggest(t, names)}"
    elif etype == "too_short" or (etype == "string_pattern_mismatch" and ctx.get("pattern") == NOT_BLANK):
        problem = "must not be empty"
    elif etype in _TYPE_WORDS:
        problem = f"expected {_TYPE_WORDS[etype]}, got {_show(inp)}"
        allowed = _TYPE_ALLOWED.get(etype)
    else:  # pragma: no cover - a pydantic error we did not anticipate; keep it one line
        problem = first.get("msg", etype)
    return StudyError(source, _path_text(loc) or "(top level)", problem, allowed)


# --------------------------------------------------------------------------- entry points


def load_study_text(text: str, source: str = _DEFAULT_SOURCE, *, base_dir: str | os.PathLike | None = None) -> Study:
    """Validate a study given as YAML text. Relative paths resolve against ``base_dir``
    (default: the directory of ``source`` if it is a file path, else the working directory)."""
    source = str(source)
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise _yaml_error(source, exc) from None
    if raw is None:
        raise StudyError(source, "", "the file is empty; expected a mapping of study keys")
    if not isinstance(raw, dict):
        raise StudyError(source, "", f"the top level must be a mapping of study keys, got {type(raw).__name__}"
                         f" {_show(raw)}")
    raw = _str_keys(raw)
    if "source" in raw:
        keys = [k for k in Study.model_fields if k != "source"]
        raise StudyError(source, "source", "unknown key (set by the loader, not the file)", ", ".join(keys))
    if base_dir is None:
        base_dir = os.path.dirname(os.path.abspath(source)) if not source.startswith("<") else os.getcwd()
    data = dict(raw, source=source)
    try:
        return Study.model_validate(data, context={"source": source, "base_dir": str(base_dir)})
    except ValidationError as exc:
        raise _convert(source, exc, raw) from None


def load_study(path: str | os.PathLike) -> Study:
    """Read and validate a study file; every problem is a :class:`StudyError`."""
    source = str(path)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StudyError(source, "", "file not found") from None
    except IsADirectoryError:
        raise StudyError(source, "", "is a directory, not a study file") from None
    except UnicodeDecodeError as exc:
        raise StudyError(source, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise StudyError(source, "", f"cannot read: {exc.strerror or exc}") from None
    return load_study_text(text, source, base_dir=os.path.dirname(os.path.abspath(source)))
