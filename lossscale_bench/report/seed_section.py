"""The report's section on a study whose seeds were added until decided: read from the parent run's tags.

``lsbench run`` writes the verdicts of the looks as tags on the study's parent
run (``lsbench.seeds.*``, ``lossscale_bench.seed_rounds``).  The tables' ``vs
baseline`` column is each row's fixed-n test on all its seeds; after several
looks only the group-sequential verdicts keep the stated error rates, so the
reports (markdown, HTML and LaTeX, the tables and ``--compare``) add them in a section of their own.  A study run with a list
of seeds has no such tags and its report is unchanged.
"""

from __future__ import annotations

__all__ = ["SEEDS_TAG", "TITLE", "seed_looks", "seed_section", "with_seed_section"]

#: the prefix of the parent run's tags (seed_rounds.TAG_PREFIX writes them)
SEEDS_TAG = "lsbench.seeds."
#: the section's heading, in every format
TITLE = "Seeds added until decided"


def seed_looks(tracking_uri: str, study: str) -> tuple[str, list[str]] | None:
    """The section's text, format-free: its paragraph and one line per pair; None without the tags."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(study)
    if exp is None:
        return None
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`lsbench.role` = 'study'", max_results=1)
    tags = parents[0].data.tags if parents else {}
    if f"{SEEDS_TAG}method" not in tags:
        return None
    pairs = sorted((k, v) for k, v in tags.items() if k.startswith(f"{SEEDS_TAG}pair."))
    paragraph = (
        f"Plan: {tags.get(f'{SEEDS_TAG}plan', '?')}. Method: {tags[f'{SEEDS_TAG}method']}; alpha 0.05 for a "
        "false difference and for a false equivalence, per pair. The tables' fixed-n tests of all the seeds do "
        "not account for the looks; these verdicts do (looks: how many times the pair was judged, n: its seeds "
        "at the last). Their error rates assume roughly normal per-seed differences: a look whose differences "
        "Shapiro–Wilk flags (p < 0.05) decides nothing. A decision is final; equivalence is per pair (Holm "
        "controls only the family's false differences)."
    )
    maxes = [m for m in tags.get(f"{SEEDS_TAG}maxes", "").split(",") if m]
    if len(maxes) > 1:
        paragraph += (
            f" The plan's max was changed after looks had been taken (max {' then '.join(maxes)}): the pairs "
            "decided before keep their verdicts; the looks of the pairs that went on are outside the plan's "
            "stated error rates (a max chosen after seeing results is not part of the plan)."
        )
    lines = [
        f"{k[len(SEEDS_TAG) + len('pair.') :].split('.row')[0].replace('.b', ' batch ', 1)}: {v}" for k, v in pairs
    ]
    return paragraph, lines


def seed_section(tracking_uri: str, study: str, fmt: str = "markdown") -> str:
    """The section in ``fmt`` (markdown, html or latex; csv has none): the method, the plan and one line per pair
    with its verdict and looks; "" for a study without the tags."""
    looks = seed_looks(tracking_uri, study) if fmt in ("markdown", "html", "latex") else None
    if looks is None:
        return ""
    paragraph, lines = looks
    if fmt == "html":
        import html

        from .renderers.html import md_inline_to_html

        items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
        return f'<h2>{TITLE}</h2>\n<p class="note">{md_inline_to_html(paragraph)}</p>\n<ul>{items}</ul>\n'
    if fmt == "latex":
        from .renderers.latex import latex_escape

        items = "\n".join(rf"\item {latex_escape(line)}" for line in lines)
        return f"\n% {TITLE}\n{latex_escape(paragraph)}\n\\begin{{itemize}}\n{items}\n\\end{{itemize}}\n"
    from .renderers.markdown import md_text

    return "\n".join(["", f"## {TITLE}", "", paragraph, "", *[f"- {md_text(line)}" for line in lines]]) + "\n"


def with_seed_section(text: str, tracking_uri: str, study: str | None, fmt: str) -> str:
    """``text`` (a report in ``fmt``) with the seed-plan section: before an HTML page's ``</body>``, else at the end."""
    section = seed_section(tracking_uri, study, fmt) if study else ""
    if not section:
        return text
    if fmt == "html" and "</body>" in text:
        head, _, tail = text.rpartition("</body>")
        return f"{head}{section}</body>{tail}"
    return text + section
