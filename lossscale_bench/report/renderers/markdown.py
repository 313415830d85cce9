"""Markdown renderer: a summary -> one ``##`` section per study, a table per (model, batch)."""

from __future__ import annotations

import re

from ..metric_names import value_header
from ..runs import model_name
from ..tables import EMULATED_MARK, HEADERS, VS_HEADER, bold_split, report_tables, study_notes, table_heading

__all__ = ["render_markdown", "md_alt", "md_cell", "md_text", "Markdown", "md_table"]


_BREAKS = re.compile(r"\s*[\r\n]+\s*")
#: what would break a table cell: a backslash (it could escape the next character), a pipe, and a ``<``
#: that could open raw HTML or an autolink (``p<0.001`` cannot)
_MD_STRUCTURE = re.compile(r"([\\|]|<(?=[A-Za-z/!?]))")
#: and what else can change what a label means in GitHub-flavoured markdown: code spans, emphasis,
#: strikethrough, links and images (a ``]`` that a ``(`` or ``[`` follows: ``[a](b)``, ``[a][b]``; a lone
#: ``[x]`` stays as written, as no reference definition can sit in a table), an ``_`` that could open
#: or close emphasis (not one inside a word such as ``fp8_e4m3``, which GFM leaves alone) and an ``&``
#: that starts an entity (``&lt;``)
_MD_SPECIAL = re.compile(r"[\\|`*~]|\](?=[(\[])|<(?=[A-Za-z/!?])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|&(?=#?\w+;)")


class Markdown(str):
    """Text that is already markdown (a label escaped by :func:`md_text`, a bold value built here):
    :func:`md_cell` leaves it as it is."""


def md_text(text) -> Markdown:
    """``text`` (a label, a study name: data from a study file or any run in a store) as literal text.

    ``[x](javascript:...)`` would otherwise become a live link, ``*a*`` emphasis, a backtick a code
    span. Line breaks become one space and every character of :data:`_MD_SPECIAL` gets a backslash
    (CommonMark reads any backslash-escaped ASCII punctuation as the character itself), the
    backslash first so an escape is never escaped away. (A bare ``http://`` address is still made a
    link by GitHub's autolink extension; that link shows its own address, so it hides nothing.)
    """
    return Markdown(_MD_SPECIAL.sub(lambda m: "\\" + m.group(0), _BREAKS.sub(" ", str(text))))


#: ASCII punctuation that could end an alt text early or turn into emphasis, strikethrough, HTML, an entity
#: or code there (CommonMark reads each backslash-escaped as itself); ``-``, ``:``, ``,``, ``.``, ``(``,
#: ``)``, quotes, ``/``, ``%``, ``+``, ``=``, ``?`` and ``;`` mark nothing up and are left as written
_PUNCTUATION = re.compile(r"[!#$&*<>@\[\\\]^_`{|}~]")


def md_alt(text) -> str:
    """``text`` as an image's alt text (``![text](file.png)``): one line, every ASCII punctuation
    character that marks something up escaped, so no bracket ends the alt text early and no ``*``, ``_``, ``<`` or backtick in a
    label or study name turns into emphasis, HTML or code there."""
    return _PUNCTUATION.sub(lambda m: "\\" + m.group(0), _BREAKS.sub(" ", str(text)))


def md_cell(text) -> str:
    """``text`` safe inside one table cell: the package's own wording (verdicts, ``~17 seeds``,
    ``[95% CI]``) keeps its markdown; only what would split the row or open HTML is escaped (a line
    break becomes one space, ``|`` becomes ``\\|``, a backslash is doubled first). Labels go through
    :func:`md_text` first (a :class:`Markdown` value passes through unchanged)."""
    if isinstance(text, Markdown):
        return text
    return _MD_STRUCTURE.sub(lambda m: "\\" + m.group(0), _BREAKS.sub(" ", str(text)))


def md_table(header: list[str], body: list[list[str]]) -> list[str]:
    """A markdown table, its columns padded to one width, as lines."""
    header = [md_cell(h) for h in header]
    body = [[md_cell(c) for c in r] for r in body]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(header), "| " + " | ".join("-" * w for w in widths) + " |", *(line(r) for r in body)]


def render_markdown(summary, runs, metric) -> str:
    out: list[str] = []
    for study, sg in summary.groupby("study", dropna=False, sort=False):
        out += [f"## {md_text(study)}", ""]
        for tstudy, model, bs, rows, has_vs in report_tables(sg, metric):
            body = []
            for label, cell, best, emu, vs in rows:
                if best:
                    v, rest = bold_split(cell)
                    cell = Markdown(f"**{md_cell(v)}**{md_cell(rest)}")  # the value: numbers, no label
                body.append(
                    [model_name(model), md_text(label + (f" {EMULATED_MARK}" if emu else "")), str(bs), cell]
                    + ([vs] if has_vs else [])
                )
            out += [f"### {md_text(table_heading(tstudy, model, bs))}", ""]
            out += md_table([*HEADERS, value_header(metric)] + ([VS_HEADER] if has_vs else []), body)
            out.append("")
        srun = runs[runs["study"] == study] if runs is not None else None
        for note in study_notes(sg, srun, metric):
            out += [note, ""]
    return "\n".join(out).rstrip("\n") + "\n"
