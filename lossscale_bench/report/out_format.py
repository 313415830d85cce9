"""Which report format a command writes, from ``--format`` and ``--out``'s file name (no pandas here,
so the CLI can check its arguments before anything heavy is imported).

Why: ``--format html --out x.md`` used to write an HTML page into a ``.md`` file without a word. Now a
known extension names the format when ``--format`` is not given (``--out table.tex`` is LaTeX), and a
``--format`` that contradicts it is refused; unknown extensions (``.txt``) are taken as written.
"""

from __future__ import annotations

from pathlib import Path

#: format name -> the file extension the report writes
FORMATS: dict[str, str] = {"markdown": "md", "csv": "csv", "html": "html", "latex": "tex"}
#: file extension -> the format it means
EXTENSION_FORMATS: dict[str, str] = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".csv": "csv",
    ".html": "html",
    ".htm": "html",
    ".tex": "latex",
}
DEFAULT_FORMAT = "markdown"


def resolve_format(fmt: str | None, out: str | None) -> str:
    """The format to write; ``ValueError`` (a one-line message) if ``fmt`` and ``out``'s extension disagree.

    ``out`` None, ``-`` (standard output) or a folder says nothing about the format."""
    implied = None
    if out and out != "-" and not out.endswith(("/", "\\")) and not Path(out).is_dir():
        implied = EXTENSION_FORMATS.get(Path(out).suffix.lower())
    if fmt is None:
        return implied or DEFAULT_FORMAT
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt}: unknown format; allowed: {', '.join(FORMATS)}")
    if implied is not None and implied != fmt:
        raise ValueError(
            f"--out {out}: a {Path(out).suffix} file is {implied}, but --format is {fmt}; "
            f"give --format {implied}, or an --out ending in .{FORMATS[fmt]}"
        )
    return fmt
