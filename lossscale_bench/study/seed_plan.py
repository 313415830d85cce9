"""The study file's seeds: the plan form of ``seeds``, and ``seed_streams`` (which random streams follow a seed).

The plan form, ``seeds: {start: 3, step: 3, max: 18, until: decided}``: seeds added in rounds until each
comparison is decided.  The list form (``seeds: [0, 1, 2]``) trains those seeds of every row, as it always
has.  The plan form trains seeds 0 .. start−1 of every row first, then adds ``step`` seeds at a time only to
the rows whose comparisons are not yet decided, up to ``max`` seeds (``lossscale_bench.seed_rounds``; the
statistics in ``lossscale_bench.report.sequential``).  In a validated study ``seeds`` is the first round's
list and ``seed_plan`` the plan: a seed's trial id is the same in both forms, so a list study's seeds count
as a plan's and back.

``pairs: baseline`` (the default) decides each row against its table's
baseline row, as the report's ``vs baseline`` column; ``pairs: all`` every
pair of rows, as ``lsbench report --compare``.  ``spending: obf`` (the
default, O'Brien–Fleming type: almost nothing spent at the first looks, so
even a large difference waits for the second look, and the last look is
nearly the fixed-n test) or ``pocock`` (Pocock type: early looks decide large
differences, the last needs more).  Both are part of the file, not flags, so
that a resumed study looks at the same comparisons in the same way.

``seed_streams: {init: trial, data: 0}`` (:class:`SeedStreams`, a section of the schema): which random
streams follow the trial's seed, each on its own: the initial weights, the training batches' order and
flips, the synthetic validation set. ``trial`` follows the seed, an integer fixes the stream for every
seed of the study; the defaults are what a seed always meant, and leave the trial ids as they were.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from .errors import StudyError, field_error, show_value
from .fields import STRICT

__all__ = ["SeedPlan", "SeedStreams", "plan_summary", "plan_text", "planned_trials", "split_seed_plan"]

_KEYS = ("start", "step", "max", "until", "pairs", "spending")
#: when to stop adding seeds
Until = Literal["decided"]
#: which comparisons decide: each row against the table's baseline (the report's column), or every pair
#: of rows (``lsbench report --compare``)
Pairs = Literal["baseline", "all"]
#: the alpha-spending functions (lossscale_bench.report.sequential.SPENDING; the study layer does not import it)
Spending = Literal["obf", "pocock"]
_UNTIL, _PAIRS, _SPENDING = get_args(Until), get_args(Pairs), get_args(Spending)
#: most seeds a row may get: beyond it a plan is almost always a typo (and its boundaries' simulation grows)
_MAX_SEEDS = 100


class SeedPlan(BaseModel):
    """A validated plan: looks after ``start``, ``start + step``, ... seeds, the last at ``max``; ``pairs``:
    ``baseline`` or ``all``; ``spending``: ``obf`` or ``pocock``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: int = Field(ge=2, le=_MAX_SEEDS)
    step: int = Field(ge=1, le=_MAX_SEEDS)
    max: int = Field(ge=2, le=_MAX_SEEDS)
    until: Until = "decided"
    pairs: Pairs = "baseline"
    spending: Spending = "obf"

    def looks(self) -> list[int]:
        """The numbers of seeds a row is looked at (the last is ``max``)."""
        sizes = list(range(self.start, self.max + 1, self.step))
        return sizes if sizes[-1] == self.max else [*sizes, self.max]


def _whole(source: str, key: str, v: Any, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= _MAX_SEEDS:
        raise StudyError(
            source, f"seeds.{key}", f"expected an integer, got {show_value(v)}", f"integers {low} <= x <= {_MAX_SEEDS}"
        )
    return v


def split_seed_plan(data: Any, source: str) -> Any:
    """A study mapping with ``seeds`` in plan form: ``seeds`` the first round's, ``seed_plan`` the plan.

    Anything else comes back as given.  A bad plan is a :class:`StudyError`
    naming ``seeds.<key>``; ``seed_plan`` itself is not a key of the file.
    """
    if not isinstance(data, Mapping):
        return data
    if "seed_plan" in data:
        raise StudyError(
            source,
            "seed_plan",
            "not a key of a study file",
            "seeds: [0, 1, 2] or seeds: {start: 3, step: 3, max: 18, until: decided}",
        )
    plan = data.get("seeds")
    if not isinstance(plan, Mapping):
        return data
    for key in plan:
        if key not in _KEYS:
            raise StudyError(source, f"seeds.{key}", "unknown key of a seed plan", ", ".join(_KEYS))
    for key in ("start", "step", "max"):
        if key not in plan:
            raise StudyError(source, f"seeds.{key}", "missing", "seeds: {start: 3, step: 3, max: 18, until: decided}")
    start = _whole(source, "start", plan["start"], 2)
    step = _whole(source, "step", plan["step"], 1)
    top = _whole(source, "max", plan["max"], 2)
    if top < start:
        raise StudyError(source, "seeds.max", f"{top} is below seeds.start ({start})", f"integers >= {start}")
    until = plan.get("until", "decided")
    if until not in _UNTIL:
        raise StudyError(source, "seeds.until", f"unknown value {show_value(until)}", ", ".join(_UNTIL))
    pairs = plan.get("pairs", "baseline")
    if pairs not in _PAIRS:
        raise StudyError(source, "seeds.pairs", f"unknown value {show_value(pairs)}", ", ".join(_PAIRS))
    spending = plan.get("spending", "obf")
    if spending not in _SPENDING:
        raise StudyError(source, "seeds.spending", f"unknown value {show_value(spending)}", ", ".join(_SPENDING))
    return {
        **data,
        "seeds": list(range(start)),
        "seed_plan": SeedPlan(start=start, step=step, max=top, until=until, pairs=pairs, spending=spending),
    }


def planned_trials(study) -> list:
    """Every trial the study may train: its seeds' trials, or with a plan seeds 0 .. max−1 of every row."""
    if study.seed_plan is None:
        return study.trials()
    return study.model_copy(update={"seeds": list(range(study.seed_plan.max))}).trials()


def plan_text(plan: SeedPlan) -> str:
    """``seeds 0-2 of every row first, then 3 more at a time for the rows of undecided comparisons, up to 18``."""
    return (
        f"seeds 0-{plan.start - 1} of every row first, then {plan.step} more at a time for the rows of "
        f"undecided comparisons, up to {plan.max}"
    )


def plan_summary(study) -> str:
    """What ``lsbench validate`` says of a plan study under its trial table: the table is the first round,
    and how many trials the plan may train at most (every row at ``max`` seeds)."""
    plan = study.seed_plan
    first, most = len(study.trials()), len(planned_trials(study))
    return (
        f"a seed plan (seeds added until decided): the {first} trials above are the first round; "
        f"{plan_text(plan)}: at most {most} trials"
    )


# --------------------------------------------------------------------------- seed_streams


def _stream_seed(v: Any):
    """``trial`` (the trial's own seed) or a fixed seed, an integer in [0, 2**32)."""
    if v == "trial" or v is None:
        return v
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32:
        return v
    raise field_error(f"{show_value(v)} is not a seed", "'trial' (the trial's seed) or an integer 0 to 4294967295")


StreamSeed = Annotated[Literal["trial"] | int | None, BeforeValidator(_stream_seed)]


class SeedStreams(BaseModel):
    """Which random streams follow the trial's seed, each on its own (to tell where seed noise
    comes from). ``init``: the initial weights (torch, Python and numpy RNGs before the model is
    built); ``data``: the order of the training batches and their flips; ``val``: the synthetic
    validation set (generated from that seed, as the dataset's own ``seed`` generates it).

    ``trial`` follows the trial's seed; an integer fixes the stream for every seed of the study,
    so the seeds' spread is the other streams' alone. The defaults are what a seed always meant:
    weights and data follow the seed, the validation set is the dataset's (``val`` not given), and
    a study that leaves this section out keeps its trial ids.
    """

    model_config = STRICT

    init: StreamSeed = "trial"
    data: StreamSeed = "trial"
    #: not given: the dataset's own validation set (its ``seed``)
    val: StreamSeed = None

    def given(self) -> dict[str, int | str]:
        """The streams set otherwise than the default, as written: ``{"init": 0}``, ``{"val": "trial"}``.
        This, not the seeds it resolves to, enters the trial id: the seeds of one row then share a
        configuration (``config_id`` leaves out only the seed) and pool in the report."""
        defaults = {"init": "trial", "data": "trial", "val": None}
        return {k: getattr(self, k) for k, d in defaults.items() if getattr(self, k) != d}
