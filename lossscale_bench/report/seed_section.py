"""The report's section on a study whose seeds were added until decided: read from the parent run's tags.

``lsbench run`` writes the verdicts of the looks as tags on the study's parent
run (``lsbench.seeds.*``, ``lossscale_bench.seed_rounds``).  The tables' ``vs
baseline`` column is each row's fixed-n test on all its seeds; after several
looks only the group-sequential verdicts keep the stated error rates, so the
markdown report adds them in a section of their own.  A study run with a list
of seeds has no such tags and its report is unchanged.
"""

from __future__ import annotations

__all__ = ["SEEDS_TAG", "seed_section"]

#: the prefix of the parent run's tags (seed_rounds.TAG_PREFIX writes them)
SEEDS_TAG = "lsbench.seeds."


def seed_section(tracking_uri: str, study: str) -> str:
    """Markdown: the method, the plan and one line per pair with its verdict and looks; "" without the tags."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(study)
    if exp is None:
        return ""
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`lsbench.role` = 'study'", max_results=1)
    tags = parents[0].data.tags if parents else {}
    if f"{SEEDS_TAG}method" not in tags:
        return ""
    pairs = sorted((k, v) for k, v in tags.items() if k.startswith(f"{SEEDS_TAG}pair."))
    lines = [
        "",
        "## Seeds added until decided",
        "",
        (
            f"Plan: {tags.get(f'{SEEDS_TAG}plan', '?')}. Method: {tags[f'{SEEDS_TAG}method']}; alpha 0.05 for a "
            "false difference and for a false equivalence, per pair. The vs baseline column above is each row's "
            "fixed-n test on all its seeds and does not account for the looks; these verdicts do (looks: how many "
            "times the pair was judged, n: its seeds at the last)."
        ),
        "",
    ]
    lines += [
        f"- {k[len(SEEDS_TAG) + len('pair.') :].split('.row')[0].replace('.b', ' batch ', 1)}: {v}" for k, v in pairs
    ]
    return "\n".join(lines) + "\n"
