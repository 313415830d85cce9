"""A Ray worker stopped by SIGTERM inside a finalizer prints no "Exception ignored ... SystemExit"
(lossscale_bench/orchestration/quiet_exit.py); any other exception a finalizer raises still shows."""

from __future__ import annotations

import sys
import weakref

from lossscale_bench.orchestration.quiet_exit import quiet_exit_in_finalizers


class _Obj:
    pass


def _finalizer_raising(exc: BaseException) -> None:
    """Drop an object whose weakref callback raises ``exc``: Python reports it as unraisable."""
    obj = _Obj()

    def callback(_ref):
        raise exc

    ref = weakref.ref(obj, callback)
    del obj
    assert ref() is None


def test_only_an_exit_request_inside_a_finalizer_is_dropped(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    quiet_exit_in_finalizers()
    quiet_exit_in_finalizers()  # a reused worker installs it per trial: still one filter
    _finalizer_raising(SystemExit(1))  # what Ray's SIGTERM handler raises
    _finalizer_raising(ValueError("a real problem"))
    assert seen == [ValueError]
