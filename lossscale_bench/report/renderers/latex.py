"""LaTeX renderer: a summary -> booktabs tables (needs ``\\usepackage{booktabs}``)."""

from __future__ import annotations

import re

from ..metric_names import value_header
from ..runs import model_name
from ..tables import EMULATED_MARK, HEADERS, VS_HEADER, bold_split, report_tables, study_notes, table_heading

__all__ = ["render_latex", "latex_escape", "md_inline_to_latex"]

_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    # OT1, LaTeX's default font encoding, typesets these as ¡ ¿ — in text mode
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    "±": r"$\pm$",
    "–": "--",
    "−": r"$-$",
    "Δ": r"$\Delta$",
    EMULATED_MARK: r"$^\dagger$",
}
_LATEX_RE = re.compile("|".join(re.escape(k) for k in _LATEX_ESCAPES))
#: a blank line is a paragraph break, which ends a tabular row with an error: line breaks become one space
_BREAKS = re.compile(r"\s*[\r\n]+\s*")


def latex_escape(text: str) -> str:
    """``text`` as LaTeX text-mode input that typesets as written.

    Every character LaTeX treats specially is replaced (a label such as
    ``50% & more`` or ``a_b`` would otherwise break the table or the
    document), line breaks become spaces, and the report's non-ASCII
    symbols become their math-mode forms (no inputenc needed).
    """
    return _LATEX_RE.sub(lambda m: _LATEX_ESCAPES[m.group(0)], _BREAKS.sub(" ", str(text)))


def md_inline_to_latex(text: str) -> str:
    """Markdown inline text as LaTeX: escaped, with its backquoted code spans in ``\\texttt``."""
    parts = re.split(r"`([^`]*)`", text)
    return "".join(latex_escape(p) if i % 2 == 0 else r"\texttt{" + latex_escape(p) + "}" for i, p in enumerate(parts))


def render_latex(summary, runs, metric) -> str:
    out = ["% lossscale_bench report; needs \\usepackage{booktabs}"]
    for study, sg in summary.groupby("study", dropna=False, sort=False):
        out += ["", f"% study: {latex_escape(study)}"]
        for tstudy, model, bs, rows, has_vs in report_tables(sg, metric):
            headers = [*HEADERS, value_header(metric)] + ([VS_HEADER] if has_vs else [])
            out += [
                "",
                r"\begin{table}[ht]",
                r"\centering",
                r"\caption{" + latex_escape(table_heading(tstudy, model, bs)) + "}",
                r"\begin{tabular}{llrl" + ("l" if has_vs else "") + "}",
                r"\toprule",
                " & ".join(latex_escape(h) for h in headers) + r" \\",
                r"\midrule",
            ]
            for label, cell, best, emu, vs in rows:
                if best:
                    v, rest = bold_split(cell)
                    cell_tex = r"\textbf{" + latex_escape(v) + "}" + latex_escape(rest)
                else:
                    cell_tex = latex_escape(cell)
                label_tex = latex_escape(label) + (latex_escape(EMULATED_MARK) if emu else "")
                vs_tex = f" & {latex_escape(vs)}" if has_vs else ""
                cells_tex = [latex_escape(model_name(model)), label_tex, latex_escape(bs), cell_tex]
                out.append(" & ".join(cells_tex) + vs_tex + r" \\")
            out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        srun = runs[runs["study"] == study] if runs is not None else None
        out.append("")
        for note in study_notes(sg, srun, metric):
            out += [md_inline_to_latex(note), ""]
    return "\n".join(out).rstrip("\n") + "\n"
