"""Calls that a stop signal must not cut in half: the signal's exception waits until the call returns.

A handler that raises (the study driver's SIGINT/SIGTERM, ``orchestration.signals``) raises between
any two bytecodes of the main thread. Raised inside an MLflow write on SQLite, it can leave the
write's connection holding the database's lock, or a connection pool's lock taken and never given
back: every later write, the one that marks the study's runs KILLED included, then waits and fails
"database is locked", or waits for ever. Measured on the development machine (2026-11-27): the first
signal sent at a random moment of a loop of ``log_batch`` calls left the store locked, and marking the
run KILLED waited 166 s, then failed; 1 of 19 Ctrl-Cs sent at random moments of an ``--executor local``
study hung the same way (none of 25, nor of 300 into the loop, since).

So a store call runs inside :func:`uninterrupted`, and the handler asks :func:`defer` first: inside
such a block (main thread) the raise is kept and made when the outermost block ends, after the call
finished; elsewhere the handler raises at once. :class:`WholeCalls` wraps an object (the MLflow
client) so that every method call is such a block.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["WholeCalls", "defer", "uninterrupted"]

#: nesting depth of :func:`uninterrupted` blocks in the main thread (signal handlers run only there)
_depth = 0
#: the raise a handler deferred, made when the outermost block ends
_pending: Callable[[], None] | None = None


def _main() -> bool:
    return threading.current_thread() is threading.main_thread()


class uninterrupted:  # noqa: N801  (used as ``with uninterrupted():``, like a function)
    """A block that a deferring signal handler (:func:`defer`) lets finish before it raises.

    Nests; outside the main thread it does nothing (no handler runs there). When the outermost block
    ends, a deferred raise is made, after the block's own exception if it had one (chained to it).
    """

    def __enter__(self) -> uninterrupted:
        global _depth
        if _main():
            _depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        global _depth, _pending
        if not _main():
            return
        _depth -= 1
        if _depth == 0 and _pending is not None:
            fire, _pending = _pending, None
            fire()


def defer(fire: Callable[[], None]) -> bool:
    """Inside an :func:`uninterrupted` block, keep ``fire`` (a raise) for the block's end and say True.

    Outside one, or outside the main thread, False: the caller raises now. A second deferral inside
    the same block replaces the first (one raise comes out, as from one signal).
    """
    global _pending
    if _depth == 0 or not _main():
        return False
    _pending = fire
    return True


class WholeCalls:
    """``obj`` with every method call made inside :func:`uninterrupted`; other attributes as they are.

    A wrapped method keeps ``__self__`` (the wrapped object), so code that reads a bound method's
    owner (a store fault naming its tracking URI) still finds it.
    """

    def __init__(self, obj: Any) -> None:
        self.wrapped = obj

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.wrapped, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with uninterrupted():
                return attr(*args, **kwargs)

        call.__self__ = self.wrapped  # type: ignore[attr-defined]
        call.__name__ = name
        return call
