"""SIGINT and SIGTERM during a study: raised as :class:`Interrupted` at a safe point, so open runs end KILLED.

A module of its own because the study runner only needs to know *that* a
signal stopped it (:meth:`SignalsRaise.interruption`); why the driver takes
the signals itself, instead of Python's or Tune's handlers, and why the handler
does not raise where it lands, is on :class:`SignalsRaise`. A re-run of the study
resumes the KILLED runs.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from ..core.uninterrupted import deferring, request_stop, safe_point, stop_requested, withdraw

__all__ = ["Interrupted", "SignalsRaise"]


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
    """While installed, SIGINT and SIGTERM stop the study: :class:`Interrupted` is raised at the next safe point.

    Python's default SIGTERM ends the process at once (and ``ray.init`` replaces
    it with ``sys.exit``), leaving every MLflow run RUNNING forever; Tune's own
    SIGINT handler stops quietly and returns as if the study were done. So the
    driver takes both signals itself; :meth:`install` is called again after
    ``ray.init``.

    The handler does not raise: it requests the stop
    (:func:`lossscale_bench.core.uninterrupted.request_stop` says why: a raise inside
    a store call can leave the store locked, one inside a garbage-collection callback
    is dropped). The raise comes at the next safe point: the end of a store call, a
    trial's step boundary under ``--executor local``, Tune's wait loop (about ten
    times a second), between trials and rounds. When no safe point comes within
    :attr:`FALLBACK_S` (a long evaluation, ``ray.init``), a watchdog thread sends
    the main thread a SIGINT of its own and the handler raises where it lands,
    unless a store call is running (then at its end); a raise that lands in a
    callback and is dropped reaches ``sys.unraisablehook``, which requests the stop
    again. Outside the main thread (a library caller's worker thread) signals cannot
    be handled and nothing is installed.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    #: seconds a requested stop waits for a safe point before the watchdog raises it where the main thread is
    FALLBACK_S = 1.0
    #: seconds an :class:`Interrupted` raised but not taken by the runner (swallowed on its way) waits
    #: before the stop is requested again
    RETAKE_S = 5.0
    #: the guard installed over several studies' runs (a seed plan's rounds), reused by each ``run_study``
    current: SignalsRaise | None = None

    def __init__(self) -> None:
        self.old: dict[int, Any] = {}
        self.active = threading.current_thread() is threading.main_thread()
        #: the first signal received (Ray may re-raise it as a plain KeyboardInterrupt or a SystemError)
        self.received: int | None = None
        #: how many runs the first signal's handling marked KILLED: a second signal (Ctrl-C twice) that
        #: cuts the Ray shutdown short raises an :class:`Interrupted` of its own, which must say the same
        self.killed = 0
        #: the runner has taken the stop (it is closing the runs): a further signal raises at once
        self.taken = False
        #: a ``run_study`` under this guard opened the study's parent run (a plan's rounds may end it)
        self.opened_parent = False
        self._asked: float | None = None  # when the pending request was made (monotonic)
        self._raised: float | None = None  # when its Interrupted was raised, not taken yet
        self._nudge = False
        self._watch: threading.Thread | None = None
        self._quit = threading.Event()
        self._old_hook: Any = None

    # -- the handler and its raises ------------------------------------------------------------
    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = int(signum)
        if self._nudge:  # the watchdog's: no safe point took the request in time
            self._nudge = False
            if stop_requested() and not deferring():
                withdraw()
                self._fire()
            return
        if self.taken and not deferring():  # Ctrl-C again while the runs are closed or Ray shuts down
            self._fire()
        self._request()

    def _request(self) -> None:
        self._asked = time.monotonic()
        request_stop(self._fire)

    def _fire(self) -> None:
        self._asked = None
        self._raised = time.monotonic()
        stop = Interrupted(self.received or signal.SIGINT)
        stop.killed = self.killed
        raise stop

    def _unraisable(self, unraisable) -> None:
        """A raise that landed in a callback (a finalizer, a weakref's) was dropped: request the stop again."""
        if isinstance(unraisable.exc_value, Interrupted) and not self.taken:
            self._raised = None
            self._request()
            return
        (self._old_hook or sys.__unraisablehook__)(unraisable)

    def _watchdog(self) -> None:
        main = threading.main_thread().ident
        while not self._quit.wait(0.2):
            now = time.monotonic()
            if self.taken:
                continue
            if self._raised is not None and now - self._raised > self.RETAKE_S:
                self._raised = None  # raised, but nothing took it: something on its way swallowed it
                self._request()
            asked = self._asked
            due = asked is not None and stop_requested() and now - asked >= self.FALLBACK_S
            if due and main is not None and signal.getsignal(signal.SIGINT) == self._handle:
                self._asked = now  # the next nudge after another FALLBACK_S, if this one is lost
                self._nudge = True
                signal.pthread_kill(main, signal.SIGINT)

    # -- installed and taken -------------------------------------------------------------------
    def install(self) -> None:
        """Take SIGINT and SIGTERM (again, after a library replaced a handler); start the watchdog."""
        if not self.active:
            return
        for s in self.SIGNALS:
            prev = signal.signal(s, self._handle)
            self.old.setdefault(s, prev)
        if self._old_hook is None:
            self._old_hook = sys.unraisablehook
            sys.unraisablehook = self._unraisable
        if self._watch is None:
            self._quit.clear()
            self._watch = threading.Thread(target=self._watchdog, name="lsbench-signals", daemon=True)
            self._watch.start()

    def check(self) -> None:
        """A safe point: raise the requested stop now (:func:`lossscale_bench.core.uninterrupted.safe_point`)."""
        safe_point()

    def hold(self) -> None:
        """The stop is taken: ignore further signals while the open runs are being marked KILLED (a few writes)."""
        self.taken = True
        withdraw()
        self._asked = self._raised = None
        if self.active:
            for s in self.SIGNALS:
                signal.signal(s, signal.SIG_IGN)

    def restore(self) -> None:
        """The handlers, the unraisable hook and the watchdog as they were before :meth:`install`."""
        if not self.active:
            return
        if self._watch is not None:
            self._quit.set()
            self._watch.join(timeout=5)
            self._watch = None
        if self._old_hook is not None:
            sys.unraisablehook = self._old_hook
            self._old_hook = None
        for s, h in self.old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        if not self.taken:
            withdraw()

    def interruption(self, exc: BaseException) -> Interrupted | None:
        """The :class:`Interrupted` that ``exc`` stands for, or None when no signal caused it.

        Ray re-raises a signal caught in its own code in its own ways (a plain
        ``KeyboardInterrupt``, a ``SystemError``): whatever came out after a signal
        arrived is that signal.
        """
        if self.received is None and not isinstance(exc, KeyboardInterrupt):
            return None
        return exc if isinstance(exc, Interrupted) else Interrupted(self.received or signal.SIGINT)
