"""A study run in rounds (seeds added until decided): one stop-signal guard over every round and look, and
the study's parent run ended once, as what happened.

Why: each round is one :func:`.study_runner.run_study` call, and between two of them the driver looks at
the store (the pairs' verdicts) with no runner active. A Ctrl-C there used to fall to Python's default
handler after the round had ended the parent run FINISHED (``lsbench.status=finished``) with pairs still
open. So :func:`plan_rounds` keeps one :class:`.signals.SignalsRaise` installed from the first round to the
last (each ``run_study`` reuses it), a round leaves the parent run RUNNING (``end_parent=False``), and:

* the plan ends (no open pair can get another seed): :func:`finish_plan` ends the parent as a single
  ``run_study`` would (FINISHED, or FAILED when a trial failed);
* a signal anywhere: the parent ends KILLED, ``lsbench.status=interrupted``, and :class:`.signals.Interrupted`
  is raised; the same command continues with the open pairs (a decided one stays decided);
* another error between rounds: the parent ends FAILED with it, and it is raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from .signals import SignalsRaise

__all__ = ["Rounds", "finish_plan", "plan_rounds"]


def _parent(tracker, study_name: str) -> str | None:
    exp_id = tracker.experiment_id(study_name, create=False)
    if exp_id is None:
        return None
    found = tracker.client.search_runs([exp_id], filter_string="tags.`lsbench.role` = 'study'", max_results=1)
    return found[0].info.run_id if found else None


def finish_plan(tracking_uri: str, study_name: str, trial_ids: Iterable[str]) -> None:
    """The last round is done: the parent run's counts over ``trial_ids`` (the trials the plan wanted), ended."""
    from ..tracking.tracker import Tracker

    tracker = Tracker(tracking_uri)
    parent = _parent(tracker, study_name)
    if parent is not None:
        tracker.end_study(parent, list(trial_ids))


def _end_parent(tracking_uri: str, study_name: str, error: str | None) -> None:
    """The parent run KILLED (interrupted: resumable) or, with ``error``, FAILED; a store that fails too is left."""
    from ..tracking.tracker import Tracker

    try:
        tracker = Tracker(tracking_uri)
        parent = _parent(tracker, study_name)
        if parent is None:
            return
        if error is None:
            tracker.end_interrupted(parent)
        else:
            tracker.set_tags(parent, {"lsbench.status": "failed", "lsbench.error": error[:5000]})
            tracker.client.set_terminated(parent, status="FAILED")
    except Exception:  # noqa: BLE001 - the stop or the error that ended the plan is the one to report
        pass


class Rounds:
    """What :func:`plan_rounds` yields: :meth:`each` wraps the runner of one round."""

    def __init__(self, guard: SignalsRaise) -> None:
        self.guard = guard
        #: the trials the last round wanted (all the plan's so far): the parent run's counts at the end
        self.wanted: list[str] = []

    def each(self, run):
        """``run(trials=...)`` (``run_study`` with the caller's options) as one round: the parent run left open."""

        def one_round(trials):
            self.wanted = [t.trial_id for t in trials]
            return run(trials=trials, end_parent=False)

        return one_round


@contextmanager
def plan_rounds(tracking_uri: str, study_name: str) -> Iterator[Rounds]:
    """The block runs a seed plan's rounds (each through :meth:`Rounds.each`); when it ends the parent run is
    ended by :func:`finish_plan`; a signal or an error inside ends it as the module doc says."""
    guard = SignalsRaise()
    guard.install()
    SignalsRaise.current = guard
    rounds = Rounds(guard)
    try:
        yield rounds
        guard.check()
        if guard.opened_parent:
            finish_plan(tracking_uri, study_name, rounds.wanted)
        guard.check()
    except BaseException as exc:
        stop = guard.interruption(exc)
        if stop is None:
            from ..trial.outcome import failure_text

            if guard.opened_parent:  # else the parent is not this driver's (another runner holds the lock)
                _end_parent(tracking_uri, study_name, f"the study stopped: {failure_text(exc)}")
            raise
        guard.hold()
        if guard.opened_parent:
            _end_parent(tracking_uri, study_name, None)
        stop.killed = stop.killed or guard.killed
        if stop is exc:
            raise
        raise stop from None
    finally:
        SignalsRaise.current = None
        guard.restore()
