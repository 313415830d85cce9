"""Markdown renderer: a summary -> one ``##`` section per study, a table per (model, batch)."""

from __future__ import annotations

from .report_summary import model_name
from .report_tables import EMULATED_MARK, HEADERS, VS_HEADER, _bold_split, _heading, _study_notes, _tables, _value_header

__all__ = ["render_markdown"]


def _md_table(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(header), "| " + " | ".join("-" * w for w in widths) + " |", *(line(r) for r in body)]


def render_markdown(summary, runs, metric) -> str:
    out: list[str] = []
    for study, sg in summary.groupby("study", dropna=False, sort=False):
        out += [f"## {study}", ""]
        for _, model, bs, rows, has_vs in _tables(sg, metric):
            body = []
            for label, cell, best, emu, vs in rows:
                if best:
                    v, rest = _bold_split(cell)
                    cell = f"**{v}**{rest}"
                body.append([model_name(model), label + (f" {EMULATED_MARK}" if emu else ""), str(bs), cell]
                            + ([vs] if has_vs else []))
            out += [f"### {_heading(study, model, bs)}", ""]
            out += _md_table([*HEADERS, _value_header(metric)] + ([VS_HEADER] if has_vs else []), body)
            out.append("")
        srun = runs[runs["study"] == study] if runs is not None else None
        for note in _study_notes(sg, srun, metric):
            out += [note, ""]
    return "\n".join(out).rstrip("\n") + "\n"
