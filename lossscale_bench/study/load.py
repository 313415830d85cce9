"""Reading a study: YAML (duplicate keys refused), validation, one-line errors.

Every problem becomes a :class:`StudyError` naming the file, the field path
and, where there is one, what is allowed; pydantic's own messages are never
shown (:func:`_convert` words each kind of failure).

A study file is untrusted input (it may come from a colleague, a paper's
repository or a typo), so reading one is bounded before anything can grow
without limit (README "Study-file limits"):

- :data:`MAX_FILE_BYTES` (1 MiB): the shipped studies are about 2 KB; a
  megabyte of YAML parses in about a second in PyYAML's pure-Python loader,
  so a larger file is a mistake (a data file passed as a study), not a study.
- :data:`MAX_DEPTH` (64 levels of nested lists/mappings): real studies nest
  4 deep. The limit is checked while the document is composed, before
  PyYAML's (and our) recursive code could hit Python's recursion limit
  (a 5,000-deep file was a RecursionError traceback).
- :data:`MAX_NODES` (100,000 values after expanding aliases): an alias
  repeats its anchor's contents, so nine lines of aliases ("billion laughs")
  name 10^9 values; counting the expanded size while composing stops such a
  file after reading it, in milliseconds and bounded memory. A 20,000-seed
  list (20,000 values) still gets through, to be refused by the grid limit.
- A recursive anchor (``&a [*a]``) is refused: it has no finite expansion.
- :data:`MAX_GRID_TRIALS` (1,000 trials): the largest shipped study has 27;
  every trial is a training run, an MLflow run and a Ray task, so a grid
  past 1,000 is almost always a typo (a pasted range of seeds, an extra
  zero) that would silently start days of work. ``allow_large_grid=True``
  (``--allow-large-grid``) says it is meant.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..core.registry import DATASET_NAMES, SCALING_METHODS
from ..core.wording import suggest
from .as_written import TEXT_KEYS, AsWritten
from .errors import ERROR_TYPE, StudyError, show_value
from .fields import DEFAULT_SOURCE, NOT_BLANK
from .methods import scaling_keys
from .schema import DATASET_MODELS, SECTION_MODELS, Study

# --------------------------------------------------------------------------- YAML


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (the later one would silently win)."""


def _construct_mapping(loader, node, deep=False):
    # only the mapping's own keys: a key it also takes from a merge (`<<: *defaults`) overrides that one
    own = [pair for pair in node.value if pair[0].tag != "tag:yaml.org,2002:merge"]
    loader.flatten_mapping(node)
    seen = {}
    for key_node, _ in own:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue  # SafeLoader reports unhashable keys itself
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    mapping = yaml.SafeLoader.construct_mapping(loader, node, deep=deep)
    for key_node, value_node in node.value:  # text fields as written (as_written.py says why)
        if (
            isinstance(key_node, yaml.ScalarNode)
            and key_node.value in TEXT_KEYS
            and isinstance(value_node, yaml.ScalarNode)
            and value_node.tag not in (_STR_TAG, _NULL_TAG)
            and not value_node.style
        ):
            mapping[key_node.value] = AsWritten(value_node.value, mapping.get(key_node.value))
    return mapping


_STR_TAG, _NULL_TAG = "tag:yaml.org,2002:str", "tag:yaml.org,2002:null"


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

#: largest study file read, in bytes (the module docstring says why)
MAX_FILE_BYTES = 1024 * 1024
#: deepest nesting of lists/mappings, counting the top-level mapping as 1 and a scalar inside it as 2
MAX_DEPTH = 64
#: most values (scalars, lists, mappings) the document may hold once every alias is expanded
MAX_NODES = 100_000
#: most trials a grid may have without ``allow_large_grid``
MAX_GRID_TRIALS = 1000


class _LimitExceeded(yaml.YAMLError):
    """A bound of :class:`_BoundedLoader` was hit; ``where`` is ``line L, column C``."""

    def __init__(self, mark, problem: str, allowed: str) -> None:
        super().__init__(problem)
        self.where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        self.problem = problem
        self.allowed = allowed


class _BoundedLoader(_UniqueKeyLoader):
    """:class:`_UniqueKeyLoader` whose composer bounds depth and expanded size, and refuses recursive anchors.

    PyYAML composes aliases as shared nodes, so a billion-laughs file is small
    as a node graph; it explodes in whatever walks it as a tree (our key
    conversion, pydantic). The composer therefore records each finished
    node's expanded size and height, adds an alias's recorded size to the
    running count where it is used, and stops at :data:`MAX_NODES` or
    :data:`MAX_DEPTH`. An alias to a node that has no record yet points into
    a node still being composed: a recursive anchor.
    """

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0  # collections open around the node being composed
        self._count = 0  # values so far, aliases expanded
        self._shape: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, height)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined alias is PyYAML's own error
                shape = self._shape.get(id(target))
                if shape is None:
                    raise _LimitExceeded(
                        event.start_mark,
                        f"alias *{event.anchor} is used inside its own anchor "
                        f"&{event.anchor} (a recursive structure has no end)",
                        "aliases to anchors whose value is complete",
                    )
                self._grow(shape[0], self._depth + shape[1], event.start_mark, f" (through alias *{event.anchor})")
            return super().compose_node(parent, index)
        self._grow(1, self._depth + 1, event.start_mark, "")
        self._depth += 1
        node = super().compose_node(parent, index)
        self._depth -= 1
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        shapes = [self._shape[id(c)] for c in children]
        self._shape[id(node)] = (1 + sum(s for s, _ in shapes), 1 + max((h for _, h in shapes), default=0))
        return node

    def _grow(self, size: int, depth: int, mark, how: str) -> None:
        if depth > MAX_DEPTH:
            raise _LimitExceeded(
                mark,
                f"nesting deeper than {MAX_DEPTH} levels{how}",
                f"at most {MAX_DEPTH} levels of nested lists and mappings",
            )
        self._count += size
        if self._count > MAX_NODES:
            raise _LimitExceeded(
                mark,
                f"the document holds more than {MAX_NODES} values once aliases are expanded{how}",
                f"at most {MAX_NODES} values, aliases expanded",
            )


def _parse_yaml(text: str) -> Any:
    """``text`` as Python data, every bound of :class:`_BoundedLoader` applied."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _yaml_error(source: str, exc: yaml.YAMLError) -> StudyError:
    if isinstance(exc, _LimitExceeded):
        return StudyError(source, exc.where, exc.problem, exc.allowed)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"invalid YAML: {problem}" + (f" ({context})" if context else "")
    return StudyError(source, where, text)


def _str_keys(v: Any):
    """YAML allows keys like ``1`` or ``yes`` (true); make them strings so they are named as unknown keys."""
    if isinstance(v, dict):
        return {(k if isinstance(k, str) else show_value(k)): _str_keys(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_str_keys(x) for x in v]
    return v


# --------------------------------------------------------------------------- pydantic errors -> StudyError


def _clean_loc(loc: tuple, raw: Any) -> tuple[list, tuple | None]:
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
        return [k for k in Study.model_fields if k not in ("source", "seed_plan")]
    if tag and tag[0] == "scaling":
        return scaling_keys(tag[1])
    if tag and tag[0] == "dataset":
        return list(DATASET_MODELS[tag[1]].model_fields)
    model = SECTION_MODELS.get(parent[0])
    return list(model.model_fields) if model else []


_TYPE_WORDS = {
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
}
#: what a constraint allows, where its failure alone says it (StrictBool)
_TYPE_ALLOWED = {"bool_type": "true, false"}


def _convert(source: str, exc: ValidationError, raw: Any) -> StudyError:
    """Every problem pydantic found, one :class:`StudyError` each, as the first one's ``problems``.

    In the file's order. An unknown key usually explains a 'missing' one beside it (a typo): a
    missing key in a mapping that has an unknown one is not reported on its own."""
    errors = exc.errors(include_url=False)
    typo_in = {tuple(e["loc"][:-1]) for e in errors if e["type"] == "extra_forbidden"}
    errors = [e for e in errors if not (e["type"] == "missing" and tuple(e["loc"][:-1]) in typo_in)]
    found = list({str(p): p for p in (_convert_one(source, e, raw) for e in errors)}.values())
    return StudyError.of(found)


def _convert_one(source: str, first: dict, raw: Any) -> StudyError:
    """One pydantic error worded for the user."""
    loc, tag = _clean_loc(tuple(first["loc"]), raw)
    etype = first["type"]
    ctx = first.get("ctx") or {}
    inp = first.get("input")
    allowed = None
    if etype == ERROR_TYPE:  # worded by the field's own validator (fields.py)
        problem, allowed = ctx["problem"], ctx.get("allowed")
    elif etype == "extra_forbidden":
        keys = _allowed_keys(loc[:-1], tag)
        problem = f"unknown key{suggest(loc[-1], keys)}"
        allowed = ", ".join(keys)
    elif etype == "missing":
        problem = "required key missing"
    elif etype in ("union_tag_invalid", "union_tag_not_found"):
        key, names, kind = (
            ("method", SCALING_METHODS, "scaling method")
            if loc[:1] == ["scaling"]
            else ("name", DATASET_NAMES, "dataset")
        )
        loc = loc + [key]
        allowed = ", ".join(names)
        if etype == "union_tag_not_found":
            problem = "required key missing"
        else:
            t = ctx.get("tag")
            problem = f"unknown {kind} {t!r}{suggest(t, names)}"
    elif etype == "too_short" or (etype == "string_pattern_mismatch" and ctx.get("pattern") == NOT_BLANK):
        problem = "must not be empty"
    elif etype in _TYPE_WORDS:
        problem = f"expected {_TYPE_WORDS[etype]}, got {show_value(inp)}"
        allowed = _TYPE_ALLOWED.get(etype)
    else:  # pragma: no cover - a pydantic error we did not anticipate; keep it one line
        problem = first.get("msg", etype)
    return StudyError(source, _path_text(loc) or "(top level)", problem, allowed)


# --------------------------------------------------------------------------- entry points


def _too_big(source: str, size: str) -> StudyError:
    return StudyError(
        source, "", f"the file is {size}, too large for a study file", f"at most {MAX_FILE_BYTES} bytes (1 MiB)"
    )


def load_study_text(
    text: str,
    source: str = DEFAULT_SOURCE,
    *,
    base_dir: str | os.PathLike | None = None,
    allow_large_grid: bool = False,
) -> Study:
    """Validate a study given as YAML text. Relative paths resolve against ``base_dir``
    (default: the directory of ``source`` if it is a file path, else the working directory).

    A grid of more than :data:`MAX_GRID_TRIALS` trials is refused unless ``allow_large_grid``.
    """
    source = str(source)
    if len(text) > MAX_FILE_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise _too_big(source, f"more than {MAX_FILE_BYTES} bytes")
    try:
        raw = _parse_yaml(text)
    except yaml.YAMLError as exc:
        raise _yaml_error(source, exc) from None
    if raw is None:
        raise StudyError(source, "", "the file is empty; expected a mapping of study keys")
    if not isinstance(raw, dict):
        raise StudyError(
            source, "", f"the top level must be a mapping of study keys, got {type(raw).__name__} {show_value(raw)}"
        )
    raw = _str_keys(raw)
    if "source" in raw:
        keys = [k for k in Study.model_fields if k not in ("source", "seed_plan")]
        raise StudyError(source, "source", "unknown key (set by the loader, not the file)", ", ".join(keys))
    if base_dir is None:
        base_dir = os.path.dirname(os.path.abspath(source)) if not source.startswith("<") else os.getcwd()
    data = dict(raw, source=source)
    try:
        study = Study.model_validate(data, context={"source": source, "base_dir": str(base_dir)})
    except ValidationError as exc:
        raise _convert(source, exc, raw) from None
    repeats = _repeats(study)
    if repeats:
        raise StudyError.of(repeats)
    if not allow_large_grid:
        _check_grid_size(study)
    return study


def _entry_points(study: Study, entry) -> set:
    """The grid points (model, batch size, precision, options, resources) a scaling entry gives."""
    base_res = study.resources.model_dump(mode="json")
    ov = entry.overrides()
    res = {**base_res, **(entry.resources.given() if entry.resources is not None else {})}
    return {
        (
            ov.get("model", model),
            ov.get("batch_size", bs),
            ov.get("precision", study.precision),
            repr(sorted(entry.normalized().items())),
            repr(sorted(res.items())),
        )
        for model in study.model
        for bs in study.batch_size
    }


def _repeats(study: Study) -> list[StudyError]:
    """A seed listed twice, and a scaling entry whose every trial an earlier entry already gives.

    Both were merged without a word: the seed ran once, and the second entry's trials were the
    first's, so its label vanished from every table. An entry that shares only some of its
    trials with another (an override equal to one value of an axis) stays: it adds the others.
    """
    out = []
    first_at: dict[int, int] = {}
    for i, seed in enumerate(study.seeds):
        j = first_at.setdefault(seed, i)
        if j != i:
            out.append(
                StudyError(
                    study.source,
                    f"seeds[{i}]",
                    f"seed {seed} is already seeds[{j}]; a seed listed twice would run once",
                    "each seed once",
                )
            )
    points = [_entry_points(study, e) for e in study.scaling]
    for k, mine in enumerate(points):
        j = next((i for i in range(k) if mine <= points[i]), None)
        if j is not None:
            out.append(
                StudyError(
                    study.source,
                    f"scaling[{k}]",
                    f"gives the same trials as scaling[{j}] (the "
                    f"same method and options); it would merge into scaling[{j}] and its label "
                    "vanish",
                    "entries that differ in an option: remove one, or change one",
                )
            )
    return out


def grid_size(study: Study) -> int:
    """How many trials ``study.trials()`` gives, without building them (40,000 TrialConfigs take seconds).

    A grid point is (model, batch size, scaling entry, seed) with the entry's
    overrides applied; points that come out the same (two entries naming the
    same options, an override that equals the axis) are one trial, as in
    :func:`~.grid.expand`. It may count a point twice that expand collapses
    through a detail of the trial id (cpus_per_trial rounding to the same
    thread count), never fewer.
    """
    points = set()
    base_res = study.resources.model_dump(mode="json")
    for model in study.model:
        for bs in study.batch_size:
            for entry in study.scaling:
                ov = entry.overrides()
                res = {**base_res, **(entry.resources.given() if entry.resources is not None else {})}
                points.add(
                    (
                        ov.get("model", model),
                        ov.get("batch_size", bs),
                        ov.get("precision", study.precision),
                        repr(sorted(entry.normalized().items())),
                        repr(sorted(res.items())),
                    )
                )
    return len(points) * len(set(study.seeds))


def _check_grid_size(study: Study) -> None:
    n = grid_size(study)
    if n > MAX_GRID_TRIALS:

        def many(k: int, one: str, more: str) -> str:
            return f"{k} {one if k == 1 else more}"

        axes = " × ".join(
            [
                many(len(study.model), "model", "models"),
                many(len(study.batch_size), "batch size", "batch sizes"),
                many(len(study.scaling), "scaling entry", "scaling entries"),
                many(len(set(study.seeds)), "seed", "seeds"),
            ]
        )
        raise StudyError(
            study.source,
            "",
            f"the grid has {n} trials ({axes}), more than {MAX_GRID_TRIALS}; if that is meant, pass --allow-large-grid",
        )  # Python: load_study(..., allow_large_grid=True)


def load_study(path: str | os.PathLike, *, allow_large_grid: bool = False) -> Study:
    """Read and validate a study file; every problem is a :class:`StudyError`.

    At most :data:`MAX_FILE_BYTES` + 1 bytes are read, so ``/dev/zero`` is refused, not read forever.
    """
    source = str(path)
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise StudyError(source, "", "file not found") from None
    except IsADirectoryError:
        raise StudyError(source, "", "is a directory, not a study file") from None
    except OSError as exc:
        raise StudyError(source, "", f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _too_big(source, f"more than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StudyError(source, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return load_study_text(
        text, source, base_dir=os.path.dirname(os.path.abspath(source)), allow_large_grid=allow_large_grid
    )
