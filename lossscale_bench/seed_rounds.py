"""``lsbench run`` for a study whose seeds are added until each comparison is decided.

A study with ``seeds: {start, step, max, until: decided}`` (:mod:`.study.seed_plan`)
is run in rounds: seeds 0 .. start−1 of every row, then a look at the store
(:func:`.report.seed_looks.seed_looks`: the pairs' group-sequential verdicts),
then the next ``step`` seeds only for the rows of the pairs still open, and so
on until every pair is decided or has reached ``max``.  Each round is one
:func:`.orchestration.run_study` call over the trials wanted so far, so
resume is the runner's own (finished and diverged trials are not run again),
and since the verdicts are replayed from the stored values, an interrupted
study resumes with the same decisions and a decided study's rerun trains
nothing.  After every look the verdicts are written as tags on the study's
parent run (:data:`TAG_PREFIX`), for a reader of the store; a pair's decision
(better, worse, equivalent) is also written once as ``<prefix>final.<pair>``
(JSON, with the ``max`` in force) and read back at every later look: it is
final, so raising ``max`` continues only the pairs that were open
(:mod:`.report.seed_looks`).  ``<prefix>maxes`` lists the ``max`` of every
plan that took looks, in order: more than one means ``max`` was changed after
seeing results, which the report says.

Above both the runner and the report in the import order: it uses both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["TAG_PREFIX", "look_at_store", "looks_text", "run_in_rounds", "stored_tags"]

#: the parent run's tags: ``<prefix>method``, ``<prefix>plan``, ``<prefix>round``, and one per pair
TAG_PREFIX = "lsbench.seeds."
_DONE = ("finished", "diverged")
#: the parent run's tag of a pair's final decision: ``<TAG_PREFIX><_FINAL><pair_key>``
_FINAL = "final."


def stored_tags(uri: str, study_name: str) -> dict[str, str]:
    """The ``lsbench.seeds.*`` tags of the study's parent run ({} when there is none yet)."""
    from .tracking.client import store_client

    client = store_client(uri)
    exp = client.get_experiment_by_name(study_name)
    if exp is None:
        return {}
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`lsbench.role` = 'study'", max_results=1)
    tags = parents[0].data.tags if parents else {}
    return {k: v for k, v in tags.items() if k.startswith(TAG_PREFIX)}


def _final(tags: dict[str, str]) -> dict[str, dict]:
    """pair_key -> the decision recorded at the look that decided it."""
    import json

    head = f"{TAG_PREFIX}{_FINAL}"
    return {k[len(head) :]: json.loads(v) for k, v in tags.items() if k.startswith(head)}


def look_at_store(uri: str, study, tags: dict[str, str] | None = None):
    """(decisions, done): the pairs' verdicts from the store (:func:`.report.seed_looks.seed_looks`) and
    (setting_id, model, batch_size, row) -> the seeds of that row that finished or diverged.

    The pairs decided at an earlier look (the parent run's ``final`` tags, or those in ``tags``) keep
    their decision.
    Only the runs of this study file's trials (seeds below the plan's ``max``) count:
    an earlier version of the file under the same name keeps its own runs apart.
    """
    from .report import load_runs, summarize
    from .report.seed_looks import seed_looks
    from .study.seed_plan import planned_trials

    plan = study.seed_plan
    ids = {t.trial_id for t in planned_trials(study)}
    runs = load_runs(uri, study.name)
    runs = runs[runs["trial_id"].isin(ids)]
    done: dict[tuple, set] = {}
    for r in runs.itertuples():
        if r.status in _DONE:
            done.setdefault((r.setting_id, r.model, r.batch_size, r.row), set()).add(int(r.seed))
    summary = summarize(runs, "final_map", study.report.equivalence_margin, values=True)
    decisions = seed_looks(
        summary,
        done,
        plan.looks(),
        margin=study.report.equivalence_margin,
        all_pairs=plan.pairs == "all",
        spending=plan.spending,
        final=_final(stored_tags(uri, study.name) if tags is None else tags),
    )
    return decisions, done


def looks_text(decisions) -> list[str]:
    """One line per pair: ``ssd_tiny b8: x128 vs fp32: equivalent (2 looks, n=6)``."""
    return [f"{r.model} b{r.batch_size}: {r.label_a} vs {r.label_b}: {r.verdict}" for r in decisions.itertuples()]


def _record(uri: str, study, decisions, round_no: int) -> None:
    """The verdicts as tags on the study's parent run (replaced at every look); a decision once (final)."""
    import json

    from .report.seed_looks import DECIDED, pair_key
    from .report.sequential import method_text
    from .tracking import set_study_tags

    plan = study.seed_plan
    before = stored_tags(uri, study.name)
    maxes = [m for m in before.get(f"{TAG_PREFIX}maxes", "").split(",") if m]
    tags = {
        f"{TAG_PREFIX}method": method_text(plan.spending),
        f"{TAG_PREFIX}plan": (
            f"start={plan.start} step={plan.step} max={plan.max} until={plan.until} "
            f"pairs={plan.pairs} spending={plan.spending}"
        ),
        f"{TAG_PREFIX}round": str(round_no),
        f"{TAG_PREFIX}maxes": ",".join(maxes if maxes and maxes[-1] == str(plan.max) else [*maxes, str(plan.max)]),
    }
    for r in decisions.itertuples():
        key = pair_key(r.model, r.batch_size, r.row_a, r.row_b)
        tags[f"{TAG_PREFIX}pair.{key}"] = f"{r.label_a} vs {r.label_b}: {r.verdict}"
        if r.outcome in DECIDED and f"{TAG_PREFIX}{_FINAL}{key}" not in before:
            numbers = {"diff": r.diff, "p_seq": r.p_seq, "p_holm": r.p_holm}
            tags[f"{TAG_PREFIX}{_FINAL}{key}"] = json.dumps(
                {"outcome": r.outcome, "looks": int(r.looks), "n": int(r.n), "max": plan.max}
                | {k: float(v) for k, v in numbers.items()}
            )
    set_study_tags(uri, study.name, tags)


def _stored_start(study, uri: str, trials) -> dict[tuple, int]:
    """Each row's seeds for the first round: ``start``, or the planned look it reached in the store already
    (a resumed or rerun study starts where it was, and its counts cover every trial it trained)."""
    from .report import ReportError
    from .report.seed_looks import reached
    from .tracking.store import sqlite_path

    plan = study.seed_plan
    target = {(t.model, t.batch_size, t.row): plan.start for t in trials}
    db = sqlite_path(uri)
    if db is not None and not db.is_file():  # a first run: the runner creates the store, under its lock
        return target
    try:
        _, done = look_at_store(uri, study)
    except ReportError:  # no store or no such study yet: a first run
        return target
    for (_, model, bs, row), seeds in done.items():
        if (model, bs, row) in target:
            target[(model, bs, row)] = max(target[(model, bs, row)], reached(seeds, plan.looks()))
    return target


def run_in_rounds(study, run: Callable[..., Any], *, tracking_uri: str, say: Callable[[str], None] = print):
    """Run ``study``'s seed plan: ``run(trials=...)`` (``run_study`` with the caller's options) per round.

    ``tracking_uri``: the store ``run`` writes to, read before the first round
    (a study already in it starts at the looks its rows reached).

    Returns (the last round's result, the decisions).  Stops when no open pair
    can get another seed (all decided or at ``max``), or after a round that
    left a wanted trial without a result (failed: the next ``lsbench run``
    retries it, and the looks wait for it).
    """
    from .study.seed_plan import planned_trials

    plan = study.seed_plan
    trials = planned_trials(study)
    target = _stored_start(study, tracking_uri, trials)
    round_no = 0
    while True:
        round_no += 1
        batch = [t for t in trials if t.seed < target[(t.model, t.batch_size, t.row)]]
        result = run(trials=batch)
        decisions, done = look_at_store(result.tracking_uri, study)
        _record(result.tracking_uri, study, decisions, round_no)
        from .report.seed_looks import rows_to_grow

        grown = dict(target)
        for (_, model, bs, row), n in rows_to_grow(decisions, done, plan.looks()).items():
            if (model, bs, row) in grown:
                grown[(model, bs, row)] = max(grown[(model, bs, row)], n)
        have = {(m, b, r, s) for (_, m, b, r), seeds in done.items() for s in seeds}
        missing = sum((t.model, t.batch_size, t.row, t.seed) not in have for t in batch)
        open_pairs = int((decisions["outcome"] == "continue").sum())
        say(
            f"seeds round {round_no}: {len(batch)} trials so far, {open_pairs} pair(s) still open"
            + (f", {missing} trial(s) without a result (run again to retry)" if missing else "")
        )
        if grown == target or missing:
            return result, decisions
        target = grown
