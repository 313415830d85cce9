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

The YAML reading and its bounds are in :mod:`lossscale_bench.study.yaml_text`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..core.wording import suggest
from .datasets import DATASET_MODELS, DATASET_NAMES
from .errors import ERROR_TYPE, StudyError, show_value
from .fields import DEFAULT_SOURCE, NOT_BLANK
from .methods import METHOD_NAMES, scaling_keys
from .schema import SECTION_MODELS, Study
from .yaml_text import MAX_FILE_BYTES, parse_yaml, str_keys, yaml_error

#: most trials a grid may have without ``allow_large_grid``
MAX_GRID_TRIALS = 1000


# --------------------------------------------------------------------------- pydantic errors -> StudyError


def _clean_loc(loc: tuple, raw: Any) -> tuple[list, tuple | None]:
    """Drop pydantic's union tags and the index of scalar-wrapped lists; return (loc, tag model key)."""
    loc = list(loc)
    tag = None
    if loc[:1] == ["dataset"] and len(loc) > 1 and loc[1] in DATASET_NAMES:
        tag = ("dataset", loc.pop(1))
    elif loc[:1] == ["scaling"] and len(loc) > 2 and isinstance(loc[1], int) and loc[2] in METHOD_NAMES:
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
            ("method", METHOD_NAMES, "scaling method") if loc[:1] == ["scaling"] else ("name", DATASET_NAMES, "dataset")
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
        raw = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise yaml_error(source, exc) from None
    if raw is None:
        raise StudyError(source, "", "the file is empty; expected a mapping of study keys")
    if not isinstance(raw, dict):
        raise StudyError(
            source, "", f"the top level must be a mapping of study keys, got {type(raw).__name__} {show_value(raw)}"
        )
    raw = str_keys(raw)
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
