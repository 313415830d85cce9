"""SIGINT and SIGTERM during a study: raised as :class:`Interrupted`, so open runs end KILLED.

A module of its own because the study runner only needs to know *that* a
signal stopped it (:meth:`SignalsRaise.interruption`); why the driver takes
the signals itself, instead of Python's or Tune's handlers, is on
:class:`SignalsRaise`. A re-run of the study resumes the KILLED runs.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from ..core.uninterrupted import defer


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the driver while a study ran.

    A ``KeyboardInterrupt``, so that no ``except Exception`` in Tune, MLflow or
    our own retry loop swallows it, and Ray's C++ wait loops, which check for
    signals and turn a ``KeyboardInterrupt`` into their own (any other exception
    raised there comes out as a ``SystemError``), pass it on. ``run_study`` ends the
    study's open runs as KILLED (tag ``lsbench.status=interrupted``: not
    terminal, so a re-run resumes them) before re-raising; ``killed`` is how many.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)
        self.killed = 0

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


class SignalsRaise:
    """While installed, SIGINT and SIGTERM raise :class:`Interrupted` in the main thread.

    Python's default SIGTERM ends the process at once (and ``ray.init`` replaces
    it with ``sys.exit``), leaving every MLflow run RUNNING forever; Tune's own
    SIGINT handler stops quietly and returns as if the study were done. So the
    driver takes both signals itself; :meth:`install` is called again after
    ``ray.init``. A signal that lands inside a store call is raised when the call
    returns (:mod:`lossscale_bench.core.uninterrupted` says why). Outside the main
    thread (a library caller's worker thread) signals cannot be handled and nothing
    is installed.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.old: dict[int, Any] = {}
        self.active = threading.current_thread() is threading.main_thread()
        #: the first signal received (Ray may re-raise it as a plain KeyboardInterrupt or a SystemError)
        self.received: int | None = None
        #: how many runs the first signal's handling marked KILLED: a second signal (Ctrl-C twice) that
        #: cuts the Ray shutdown short raises an :class:`Interrupted` of its own, which must say the same
        self.killed = 0

    def _raise(self, signum, frame):
        if self.received is None:
            self.received = int(signum)
        if not defer(lambda: self._stop(signum)):  # inside a store call: raised when the call returns
            self._stop(signum)

    def _stop(self, signum: int) -> None:
        stop = Interrupted(signum)
        stop.killed = self.killed
        raise stop

    def install(self) -> None:
        if self.active:
            for s in self.SIGNALS:
                prev = signal.signal(s, self._raise)
                self.old.setdefault(s, prev)

    def hold(self) -> None:
        """Ignore further signals while the open runs are being marked KILLED (a few writes)."""
        if self.active:
            for s in self.SIGNALS:
                signal.signal(s, signal.SIG_IGN)

    def restore(self) -> None:
        if self.active:
            for s, h in self.old.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)

    def interruption(self, exc: BaseException) -> Interrupted | None:
        """The :class:`Interrupted` that ``exc`` stands for, or None when no signal caused it.

        Ray re-raises a signal caught in its own code in its own ways (a plain
        ``KeyboardInterrupt``, a ``SystemError``): whatever came out after a signal
        arrived is that signal.
        """
        if self.received is None and not isinstance(exc, KeyboardInterrupt):
            return None
        return exc if isinstance(exc, Interrupted) else Interrupted(self.received or signal.SIGINT)
