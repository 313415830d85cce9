"""Markdown and schema helpers of ``tools/gen_reference.py`` (no package imports here: the generator
keeps every import of ``lossscale_bench`` in one place)."""

from __future__ import annotations

import inspect
import json
import re
import typing

NOTE = "*Generated from the code by `tools/gen_reference.py`: do not edit this page, run the script instead.*"


# ===================================================================================== markdown helpers
def markdown(text: str) -> str:
    """Docstring markup as markdown: ``x`` and :role:`~a.b.x` become `x`."""
    text = re.sub(r":\w+:`~?\.*([\w.]*?)([\w]+)`", r"`\2`", text)
    return text.replace("``", "`")


def cell(text) -> str:
    """One table cell on one line: outside code spans, pipes, angle brackets and stars escaped."""
    if text in (None, ""):
        return "—"
    parts = markdown(" ".join(str(text).split())).split("`")
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        parts[i] = parts[i].replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
    return "`".join(parts)


def code(text) -> str:
    return f"`{text}`"


def table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def page(title: str, intro: str, *sections: str) -> str:
    return "\n\n".join([f"# {title}", NOTE, intro, *sections]).rstrip() + "\n"


def paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def value(v) -> str:
    if v is None:
        return "not given"
    if v == "":
        return '`""`'
    if isinstance(v, bool):
        return code("true" if v else "false")
    if isinstance(v, (list, tuple)):
        return code(json.dumps(list(v)))
    return code(v)


def attribute_docs(cls) -> dict[str, str]:
    """``#:`` comments above the class-level names of ``cls`` and its bases (the nearest class wins)."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in inspect.getmro(cls) if k.__module__.startswith("lossscale_bench")]):
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        docs.update(comment_docs(lines))
    return docs


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


#: fp32's smallest normal and its largest finite value: a range between them is named, not printed
F32_TINY, F32_MAX = 2.0**-126, 3.4028234663852886e38


def type_text(prop: dict, defs: dict) -> tuple[str, str]:
    """(type, allowed values) of a JSON-schema property, in words."""
    if "anyOf" in prop:
        parts = [p for p in prop["anyOf"] if p.get("type") != "null"]
        nullable = len(parts) < len(prop["anyOf"])
        texts = [type_text(p, defs) for p in parts]
        kinds = " or ".join(dict.fromkeys(t for t, _ in texts))
        allowed = "; ".join(a for _, a in texts if a and a != "—")
        return kinds + (" or null" if nullable else ""), allowed or "—"
    if "$ref" in prop or "oneOf" in prop:
        return "mapping", "—"
    if "const" in prop:
        return prop.get("type", "value"), code(prop["const"])
    kind = prop.get("type", "value")
    if kind == "array":
        item, allowed = type_text(prop.get("items", {}), defs)
        more = (
            [f"at least {prop['minItems']} item" + ("s" if prop["minItems"] > 1 else "")]
            if prop.get("minItems")
            else []
        )
        each = [f"each {allowed}" if allowed.startswith(("x ", "not")) else allowed] if allowed != "—" else []
        return f"list of {item}s", "; ".join(each + more) or "—"
    if "enum" in prop:
        return kind, ", ".join(code(v) for v in prop["enum"])
    if prop.get("minimum") == F32_TINY and prop.get("maximum") == F32_MAX:
        return kind, "fp32's normal range (2^-126 to about 3.4e38)"
    bounds = [
        f"{op} {prop[k]!r}"
        for k, op in (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<="))
        if k in prop
    ]
    if prop.get("pattern"):
        bounds.append("not blank")
    return kind, "x " + ", x ".join(bounds) if bounds and "not blank" not in bounds else (", ".join(bounds) or "—")


#: code-internal fragments of a field's comment, which a reader of the page has no use for
_INTERNAL = [
    re.compile(r"\s*\((?:[a-z_]+/)*[a-z_]+\.py [A-Z_]+\)"),  # (report/stats.py DEFAULT_MARGIN)
    re.compile(r"\s*\((?:[a-z_]+\.)+[A-Za-z_]+\)"),  # (grid.default_loader), (formats.BlockScaledFormat)
    re.compile(r"\s*\([A-Z][a-z]+(?:[A-Z][a-z]+)+\)"),  # (SeedStreams)
    re.compile(r";\s*(?:[a-z_]+/)*[a-z_]+\.py's module doc"),  # ; precision/runtime.py's module doc
    re.compile(r"\s*A trial option, so it lives here\."),
]
#: first words that stay lower-case at the start of a sentence (names, not words)
_LOWER = {"cuda", "cpu", "xla", "hpu", "mAP", "torch", "true", "false"}


def reader_text(text: str) -> str:
    """A field's description as a sentence for a reader: code-internal fragments dropped, a capital
    first letter (unless it starts with a name or with a value being described, ``stop: ...``), a full stop."""
    for pattern in _INTERNAL:
        text = pattern.sub("", text)
    text = text.strip()
    if not text or text == "—":
        return text
    first = re.match(r"[A-Za-z0-9_.-]+", text)
    word = first.group(0) if first else ""
    if word.isalpha() and word not in _LOWER and word.islower() and text[len(word) : len(word) + 1] != ":":
        text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def models_in(annotation) -> list[type]:
    """The pydantic models inside a field's annotation (Optional, Union, list, Annotated unwrapped)."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in typing.get_args(annotation):
        found += models_in(arg)
    return found


def anchor(key: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", key.lower().replace(" ", "-"))
