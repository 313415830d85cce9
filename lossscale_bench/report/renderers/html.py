"""HTML renderer: a summary (+ plot PNGs) -> one self-contained page."""

from __future__ import annotations

import base64
import html as _html
import re
from collections.abc import Mapping

from ..metric_names import value_header
from ..runs import model_name
from ..tables import EMULATED_MARK, HEADERS, VS_HEADER, bold_split, report_tables, study_notes, table_heading

__all__ = ["render_html", "HTML_STYLE", "md_inline_to_html"]

HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.8em; text-align: left; }
th { background: #f0f0f0; }
td.num { text-align: right; }
p.note { color: #555; }
figure { margin: 1em 0; } figure img { max-width: 100%; }
""".strip()


def md_inline_to_html(text: str) -> str:
    """Markdown inline text as HTML: escaped, with its backquoted code spans in ``<code>``."""
    parts = re.split(r"`([^`]*)`", text)
    return "".join(
        _html.escape(p) if i % 2 == 0 else "<code>" + _html.escape(p) + "</code>" for i, p in enumerate(parts)
    )


def render_html(summary, runs, metric, images: Mapping[str, bytes] | None, title: str) -> str:
    e = _html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{e(title)}</title>",
        f"<style>\n{HTML_STYLE}\n</style>",
        "</head>",
        "<body>",
        f"<h1>{e(title)}</h1>",
    ]
    for study, sg in summary.groupby("study", dropna=False, sort=False):
        out.append(f'<section class="study" id="study-{e(str(study))}">')
        out.append(f"<h2>{e(str(study))}</h2>")
        for tstudy, model, bs, rows, has_vs in report_tables(sg, metric):
            headers = [*HEADERS, value_header(metric)] + ([VS_HEADER] if has_vs else [])
            out.append(f"<h3>{e(table_heading(tstudy, model, bs))}</h3>")
            out.append("<table>")
            out.append("<thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr></thead>")
            out.append("<tbody>")
            for label, cell, best, emu, vs in rows:
                if best:
                    v, rest = bold_split(cell)
                    cell_html = f"<strong>{e(v)}</strong>{e(rest)}"
                else:
                    cell_html = e(cell)
                label_html = e(label) + (f" {EMULATED_MARK}" if emu else "")
                out.append(
                    f"<tr><td>{e(model_name(model))}</td><td>{label_html}</td>"
                    f'<td class="num">{e(str(bs))}</td><td class="num">{cell_html}</td>'
                    + (f"<td>{e(vs)}</td>" if has_vs else "")
                    + "</tr>"
                )
            out.append("</tbody>")
            out.append("</table>")
        srun = runs[runs["study"] == study] if runs is not None else None
        for note in study_notes(sg, srun, metric):
            out.append(f'<p class="note">{md_inline_to_html(note)}</p>')
        out.append("</section>")
    # plots: name -> PNG bytes, embedded so the page stays self-contained
    out.append('<section id="plots">')
    if images:
        out.append("<h2>Plots</h2>")
    for name, png in (images or {}).items():
        data = base64.b64encode(png).decode("ascii")
        out.append(
            f'<figure><img alt="{e(name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(name)}</figcaption></figure>"
        )
    out.append("</section>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"
