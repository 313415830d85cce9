"""Markdown renderer: a summary -> one ``##`` section per study, a table per (model, batch)."""

from __future__ import annotations

import re

from ..summary import model_name
from ..tables import EMULATED_MARK, HEADERS, VS_HEADER, _bold_split, _heading, _study_notes, _tables, _value_header

__all__ = ["render_markdown", "md_cell"]


_BREAKS = re.compile(r"\s*[\r\n]+\s*")
#: a backslash, a pipe, and a ``<`` that could open raw HTML or an autolink (``p<0.001`` cannot)
_MD_SPECIAL = re.compile(r"([\\|]|<(?=[A-Za-z/!?]))")


def md_cell(text) -> str:
    """``text`` safe inside one GitHub-flavoured markdown table cell.

    A line break ends the row and a ``|`` starts a new cell, so labels (the
    study's, or any string in a store's tags) could shift or split the
    table: line breaks become one space, ``|`` becomes ``\\|``. A backslash is
    doubled first (else ``a\\|b`` would escape the escape and split the cell
    after all), and a ``<`` that could start a tag is escaped so a label is
    never read as raw HTML.
    Other markdown (``*``, ``_``) can only restyle the text, so it is left
    as written: the table stays readable in a terminal.
    """
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), _BREAKS.sub(" ", str(text)))


def _md_table(header: list[str], body: list[list[str]]) -> list[str]:
    header = [md_cell(h) for h in header]
    body = [[md_cell(c) for c in r] for r in body]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(header), "| " + " | ".join("-" * w for w in widths) + " |", *(line(r) for r in body)]


def render_markdown(summary, runs, metric) -> str:
    out: list[str] = []
    for study, sg in summary.groupby("study", dropna=False, sort=False):
        out += [f"## {study}", ""]
        for tstudy, model, bs, rows, has_vs in _tables(sg, metric):
            body = []
            for label, cell, best, emu, vs in rows:
                if best:
                    v, rest = _bold_split(cell)
                    cell = f"**{v}**{rest}"
                body.append([model_name(model), label + (f" {EMULATED_MARK}" if emu else ""), str(bs), cell]
                            + ([vs] if has_vs else []))
            out += [f"### {_BREAKS.sub(' ', _heading(tstudy, model, bs))}", ""]
            out += _md_table([*HEADERS, _value_header(metric)] + ([VS_HEADER] if has_vs else []), body)
            out.append("")
        srun = runs[runs["study"] == study] if runs is not None else None
        for note in _study_notes(sg, srun, metric):
            out += [note, ""]
    return "\n".join(out).rstrip("\n") + "\n"
