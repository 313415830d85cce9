"""Keep a Ray worker's exit from printing "Exception ignored in: ... SystemExit" on the terminal.

Why (seen in tests/test_e2e.py on a loaded machine): Ray stops a worker process
with SIGTERM, and its handler (``ray._private.worker.sigterm_handler``) raises ``SystemExit``
wherever the main thread is. When that is inside a finalizer, a ``WeakSet`` entry's removal
callback during garbage collection, Python cannot raise it there and prints it as "unraisable",
and Ray forwards that worker's stderr to the driver::

    (_tune_trainable pid=24130) Exception ignored in: <function WeakSet.__init__.<locals>._remove ...>
    ...
    (_tune_trainable pid=24130) SystemExit: 1

Nothing failed: the worker was being stopped and it stops. Only that case is dropped: an
unraisable ``SystemExit`` (an exit request, never a library's error); every other unraisable
exception goes to the hook that was in place.
"""

from __future__ import annotations

import sys


def quiet_exit_in_finalizers() -> None:
    """Install the filter in this process (once; a reused worker calls it for every trial)."""
    if getattr(sys.unraisablehook, "lsbench_quiet_exit", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if unraisable.exc_type is SystemExit:
            return
        previous(unraisable)

    hook.lsbench_quiet_exit = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
