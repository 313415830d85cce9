"""A stop the driver was asked for (SIGINT/SIGTERM), raised at safe points: never inside a store call, never lost.

Why a signal handler does not raise where it lands. Python runs a handler between two bytecodes of the
main thread, in whatever frame runs then. Two of those frames are harmful:

* an MLflow write on SQLite: cut in half, it can leave its connection holding the database's lock, or a
  connection pool's lock taken and never given back, and every later write, the one that marks the
  study's runs KILLED included, then waits and fails "database is locked", or waits for ever. Measured
  on the development machine (2026-11-27): the first signal sent at a random moment of a loop of
  ``log_batch`` calls left the store locked, and marking the run KILLED waited 166 s, then failed; 1 of
  19 Ctrl-Cs sent at random moments of an ``--executor local`` study hung the same way;
* a garbage-collection or weakref callback (SQLAlchemy's ``_collection_gced`` runs often): an exception
  raised there cannot propagate; Python prints "Exception ignored in: ..." and drops it. Seen on
  the development machine: 2 of 11 SIGINT/SIGTERMs sent to a running ``--executor local`` study were dropped so,
  and the study ran to its end and exited 0.

So the handler only *requests* the stop (:func:`request_stop`, with the raise to make), and the raise is
made at a **safe point**: :func:`safe_point`, which the driver calls where it knows a raise is harmless
(between trials and rounds, at each training step of a trial it runs itself, in Tune's wait loop), and
the end of every store call (:class:`WholeCalls`). Inside an :func:`uninterrupted` block (a database
store call) a safe point waits for the outermost block's end. A request stays until it is raised; one
whose exception was dropped after all (raised by the driver's fallback inside a callback: the driver
notices through ``sys.unraisablehook``) is requested again by its owner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["WholeCalls", "deferring", "request_stop", "safe_point", "stop_requested", "uninterrupted", "withdraw"]

#: nesting depth of :func:`uninterrupted` blocks in the main thread (signal handlers run only there)
_depth = 0
#: the raise a stop request asks for, made at the next safe point (main thread, outside every block)
_pending: Callable[[], None] | None = None


def _main() -> bool:
    return threading.current_thread() is threading.main_thread()


def request_stop(fire: Callable[[], None]) -> None:
    """Ask for ``fire`` (a raise) at the next safe point; a second request replaces the first (one raise)."""
    global _pending
    _pending = fire


def withdraw() -> None:
    """Forget the requested stop (its owner has taken it: the study is being closed)."""
    global _pending
    _pending = None


def stop_requested() -> bool:
    """Whether a stop is requested and not raised yet."""
    return _pending is not None


def deferring() -> bool:
    """Whether the main thread is inside an :func:`uninterrupted` block now (a raise must wait for its end)."""
    return _depth > 0 and _main()


def safe_point() -> None:
    """Make the requested raise now, if any (main thread, outside every :func:`uninterrupted` block).

    Inside a block, or in another thread, nothing happens: the outermost block's end is the next safe
    point. The request is consumed by the raise.
    """
    global _pending
    if _pending is None or _depth > 0 or not _main():
        return
    fire, _pending = _pending, None
    fire()


class uninterrupted:  # noqa: N801  (used as ``with uninterrupted():``, like a function)
    """A block no requested stop is raised inside: the outermost block's end is a safe point.

    Nests; outside the main thread it does nothing (no handler runs there). A stop requested during the
    block is raised when the outermost block ends, after the block's own exception if it had one (chained
    to it).
    """

    def __enter__(self) -> uninterrupted:
        global _depth
        if _main():
            _depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        global _depth
        if not _main():
            return
        _depth -= 1
        if _depth == 0:
            safe_point()


class WholeCalls:
    """``obj`` with the end of every method call a safe point; with ``whole`` (the default) each call is
    also an :func:`uninterrupted` block. Other attributes are passed through as they are.

    ``whole=False`` is for calls that a raise in the middle harms nothing and that must stay interruptible
    (an MLflow server's request that hangs). A wrapped method keeps ``__self__`` (the wrapped object), so
    code that reads a bound method's owner (a store fault naming its tracking URI) still finds it.
    """

    def __init__(self, obj: Any, whole: bool = True) -> None:
        self.wrapped = obj
        self.whole = whole

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.wrapped, name)
        if not callable(attr):
            return attr

        if self.whole:

            def call(*args: Any, **kwargs: Any) -> Any:
                with uninterrupted():
                    return attr(*args, **kwargs)

        else:

            def call(*args: Any, **kwargs: Any) -> Any:
                out = attr(*args, **kwargs)
                safe_point()
                return out

        call.__self__ = self.wrapped  # type: ignore[attr-defined]
        call.__name__ = name
        return call
