"""Labels are data, not markup: a hostile label reads back as written in every report format.

A study refuses duplicate labels, but any string can reach a report: labels of runs already in a
store, labels logged by another version, a ``|`` or a line break written in the study on purpose.
The store here is a real SQLite MLflow store filled the way the trial code fills it
(``plot_store._trial``); each format is read back by a real parser: GitHub's own markdown parser
(cmarkgfm), Python's HTML parser and csv reader. No LaTeX engine is installed here, so the LaTeX
table is checked by structure (columns split at unescaped ``&``, no paragraph break, balanced
braces) and by reading every escape back.
"""

from __future__ import annotations

import csv
import io
import re
from html.parser import HTMLParser

import pytest
from plot_store import _trial

from lossscale_bench.report import write_report

STUDY = "escapes"
HOSTILE = (
    'a|b \\| c <script>alert("x")</script> 50% & $5_{x}^~#\n\nnew line\r\n, "quoted" '
    "[x](javascript:alert(1)) ![i](i.png) *em* **b** `code` _u_ ~~del~~ &lt; &#42; fp8_e4m3"
)
FLAT = re.sub(r"\s*[\r\n]+\s*", " ", HOSTILE)  # what a one-line table cell can show


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("escape-store")
    uri = f"sqlite:///{root.resolve()}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(STUDY, artifact_location=(root / "artifacts").resolve().as_uri())
    parent = client.create_run(exp, tags={"lsbench.role": "study", "lsbench.study": STUDY}).info.run_id
    for seed, m in ((0, 0.30), (1, 0.31)):
        _trial(
            client,
            exp,
            parent,
            STUDY,
            root / "csv",
            trial_id=f"r0-s{seed}",
            row=0,
            label="FP32 baseline",
            status="finished",
            seed=seed,
            method="none",
            precision="fp32",
            final_map=m,
        )
    for seed, m in ((0, 0.33), (1, 0.35)):
        _trial(
            client,
            exp,
            parent,
            STUDY,
            root / "csv",
            trial_id=f"r1-s{seed}",
            row=1,
            label=HOSTILE,
            status="finished",
            seed=seed,
            final_map=m,
        )
    return uri


def _report(uri, fmt, tmp_path):
    text, _ = write_report(uri, study=STUDY, fmt=fmt, out=tmp_path / f"r.{fmt}", plots=False)
    return text


class _Tables(HTMLParser):
    """Rows of every ``<table>`` as lists of cell texts; also every start tag seen."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self.tags: list[str] = []
        #: per row, per cell: the tags that opened inside the cell
        self.cell_tags: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self._tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
            self.cell_tags.append([])
        elif tag in ("td", "th"):
            self._cell, self._tags = [], []
        elif self._cell is not None:
            self._tags.append(tag)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self.cell_tags[-1].append(self._tags)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _parse(html_text: str) -> _Tables:
    p = _Tables()
    p.feed(html_text)
    p.close()
    return p


def test_markdown_table_survives_a_hostile_label(uri, tmp_path):
    cmarkgfm = pytest.importorskip("cmarkgfm", reason="dev extra: pip install -e '.[dev]'")
    md = _report(uri, "markdown", tmp_path)
    html = cmarkgfm.github_flavored_markdown_to_html(md)
    tables = _parse(html)
    header, *rows = tables.rows
    assert header[:2] == ["Model", "Loss scale"]
    assert all(len(r) == len(header) for r in rows), rows  # no cell split, no row cut short
    labels = [r[1] for r in rows]
    assert labels == ["FP32 baseline", FLAT], labels
    assert "script" not in tables.tags  # `<script>` is text, not raw HTML (which GitHub would drop)
    # markdown in a label stays text: no link, image, emphasis, code span or strikethrough
    assert tables.cell_tags[2][1] == [], tables.cell_tags[2][1]
    assert rows[1][3].startswith("34.00")  # the row's own numbers stayed in their column


def test_html_report_escapes_a_hostile_label(uri, tmp_path):
    page = _report(uri, "html", tmp_path)
    tables = _parse(page)
    assert "script" not in tables.tags
    rows = [r for r in tables.rows if r and r[0] != "Model"]
    # a browser shows any run of white space, line breaks included, as one space
    assert [" ".join(r[1].split()) for r in rows] == ["FP32 baseline", " ".join(HOSTILE.split())]


def test_csv_keeps_a_hostile_label_exactly(uri, tmp_path):
    text = _report(uri, "csv", tmp_path)
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert [r["label"] for r in rows] == ["FP32 baseline", HOSTILE]  # line breaks and quotes included
    assert len({len(r) for r in rows}) == 1 and all(None not in r for r in rows)  # no stray columns


_LATEX_BACK = {
    r"\textbackslash{}": "\\",
    r"\&": "&",
    r"\%": "%",
    r"\$": "$",
    r"\#": "#",
    r"\_": "_",
    r"\{": "{",
    r"\}": "}",
    r"\textasciitilde{}": "~",
    r"\textasciicircum{}": "^",
    r"\textless{}": "<",
    r"\textgreater{}": ">",
    r"\textbar{}": "|",
}
_LATEX_TOKEN = re.compile("|".join(re.escape(k) for k in sorted(_LATEX_BACK, key=len, reverse=True)))


def _unescape(tex: str) -> str:
    return _LATEX_TOKEN.sub(lambda m: _LATEX_BACK[m.group(0)], tex)


def _split_row(line: str) -> list[str]:
    """Cells of one tabular row: split at ``&`` not preceded by a backslash."""
    assert line.endswith(r" \\"), line
    return re.split(r"(?<!\\) & ", line[: -len(r" \\")])


def test_latex_table_survives_a_hostile_label(uri, tmp_path):
    tex = _report(uri, "latex", tmp_path)
    body = tex[tex.index(r"\midrule") + len(r"\midrule") : tex.index(r"\bottomrule")].strip("\n").split("\n")
    header = _split_row(tex[tex.index(r"\toprule") + len(r"\toprule") : tex.index(r"\midrule")].strip())
    assert len(body) == 2, body  # two rows, each on one line: no paragraph break inside the tabular
    cells = [_split_row(line) for line in body]
    assert all(len(c) == len(header) for c in cells), cells
    label_tex = cells[1][1]
    # nothing special is left bare: every \ starts a known escape, and the braces balance
    bare = _LATEX_TOKEN.sub("", label_tex)
    assert not re.search(r"[\\&%$#_{}~^<>|]", bare), bare
    assert _unescape(label_tex).replace("$^\\dagger$", "") == FLAT


class _Items(HTMLParser):
    """The text of every ``<li>``, the tags opened inside one, and every ``<img>``'s alt text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.items: list[str] = []
        self.inner: list[str] = []
        self.alts: list[str] = []
        self._in = False

    def handle_starttag(self, tag, attrs):
        if tag == "li":
            self._in = True
            self.items.append("")
        elif tag == "img":
            self.alts.append(dict(attrs).get("alt", ""))
        elif self._in:
            self.inner.append(tag)

    def handle_endtag(self, tag):
        if tag == "li":
            self._in = False

    def handle_data(self, data):
        if self._in:
            self.items[-1] += data


def test_the_seed_plan_list_and_the_image_alt_texts_escape_a_hostile_label(uri, tmp_path):
    # the seed-plan section listed "label vs label: verdict" as written (a `*em*` became emphasis, a
    # `<script>` raw HTML), and an image's alt text escaped only brackets
    cmarkgfm = pytest.importorskip("cmarkgfm", reason="dev extra: pip install -e '.[dev]'")
    from lossscale_bench.tracking import set_study_tags

    tags = {
        "lsbench.seeds.method": "group-sequential",
        "lsbench.seeds.plan": "start=2 step=1 max=4",
        "lsbench.seeds.pair.ssd_tiny.b4.row1-row0": f"{FLAT} vs FP32 baseline: equivalent (2 looks, n=3)",
    }
    assert set_study_tags(uri, STUDY, tags)
    md = _report(uri, "markdown", tmp_path)
    items = _Items()
    items.feed(cmarkgfm.github_flavored_markdown_to_html(md.split("## Seeds added until decided", 1)[1]))
    assert items.items == [f"ssd_tiny batch 4: {FLAT} vs FP32 baseline: equivalent (2 looks, n=3)"], items.items
    assert items.inner == [], items.inner  # no emphasis, code, link or raw HTML opened inside the item
    from lossscale_bench.report.renderers.markdown import md_alt

    alt = _Items()
    alt.feed(cmarkgfm.github_flavored_markdown_to_html(f"![{md_alt(HOSTILE)}](plot.png)\n"))
    assert alt.alts == [FLAT] and alt.inner == []
