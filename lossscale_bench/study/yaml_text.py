"""A study file's YAML read as untrusted input: duplicate keys refused, size and depth bounded.

:func:`parse_yaml` composes the document with a loader that refuses a key given twice in one mapping,
keeps text fields as written (:mod:`.as_written`), and stops at :data:`MAX_DEPTH` levels of nesting, at
:data:`MAX_NODES` values once aliases are expanded, and at a recursive anchor (why each bound, with
:data:`MAX_FILE_BYTES`: :mod:`lossscale_bench.study.load`). :func:`yaml_error` words a YAML problem as a
:class:`~.errors.StudyError`; :func:`str_keys` makes every key a string.
"""

from __future__ import annotations

from typing import Any

import yaml

from .as_written import TEXT_KEYS, AsWritten
from .errors import StudyError, show_value

__all__ = ["MAX_FILE_BYTES", "MAX_DEPTH", "MAX_NODES", "parse_yaml", "yaml_error", "str_keys"]


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


def parse_yaml(text: str) -> Any:
    """``text`` as Python data, every bound of :class:`_BoundedLoader` applied."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def yaml_error(source: str, exc: yaml.YAMLError) -> StudyError:
    """The :class:`~.errors.StudyError` for a YAML problem: where it is, what it is, what a bound allows."""
    if isinstance(exc, _LimitExceeded):
        return StudyError(source, exc.where, exc.problem, exc.allowed)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"invalid YAML: {problem}" + (f" ({context})" if context else "")
    return StudyError(source, where, text)


def str_keys(v: Any):
    """YAML allows keys like ``1`` or ``yes`` (true); make them strings so they are named as unknown keys."""
    if isinstance(v, dict):
        return {(k if isinstance(k, str) else show_value(k)): str_keys(x) for k, x in v.items()}
    if isinstance(v, list):
        return [str_keys(x) for x in v]
    return v
