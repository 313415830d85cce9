"""The joined Ray cluster's head, watched: a lost head stops the study with one line, exit 4.

Why: when the head node of a cluster joined with ``--address`` dies, Ray's own client in the driver
waits 60 s for its GCS (the head's control store) and then ends the process from C++ (exit 1, a
log line about ``gcs_server.out``), with the study's MLflow runs left RUNNING. Measured with a head and
a worker started by ``ray start`` on one machine (the commands of docs/guide/team-setup.md): exit 1
after 61 s. :class:`HeadWatch` probes the GCS port from a thread and, once it has not answered for
:data:`LOST_AFTER_S`, closes the study's open runs as after a stop signal (KILLED, ``interrupted``:
the next run resumes them) and ends the process with one ``lsbench: error:`` line, exit 4. The same
command against a new cluster continues the study.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable

from ..core.exit_codes import EXIT_STORE

__all__ = ["LOST_AFTER_S", "HeadWatch", "gcs_address"]

#: how long the head's GCS may not answer before the study stops (Ray's own client gives up at 60 s)
LOST_AFTER_S = 20.0
#: the time between two probes
PROBE_EVERY_S = 2.0


def gcs_address() -> str | None:
    """``host:port`` of the GCS of the cluster this process joined (None where Ray does not say)."""
    try:
        import ray

        return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - a Ray client connection (ray://) has none: nothing to watch
        return None


def _answers(address: str, timeout: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class HeadWatch:
    """A daemon thread probing ``address``; after ``lost_after`` seconds without an answer it calls
    ``close()`` (errors ignored: the study's runs are closed where the store allows), prints one line
    and ends the process with exit 4 (``exit`` is ``os._exit``; tests pass their own)."""

    def __init__(
        self,
        address: str,
        close: Callable[[], object],
        *,
        lost_after: float = LOST_AFTER_S,
        every: float = PROBE_EVERY_S,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self.address, self.close, self.lost_after, self.every, self.exit = address, close, lost_after, every, exit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lsbench-head-watch", daemon=True)

    def start(self) -> HeadWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        silent_since: float | None = None
        while not self._stop.wait(self.every):
            if _answers(self.address):
                silent_since = None
                continue
            now = time.monotonic()
            silent_since = now if silent_since is None else silent_since
            if now - silent_since >= self.lost_after and not self._stop.is_set():
                self._lost(now - silent_since)
                return

    def _lost(self, silent_s: float) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the line below is what matters; the next run closes what is left
            pass
        print(
            f"lsbench: error: the Ray cluster's head at {self.address} has not answered for {silent_s:.0f} s "
            "(the head node is gone); the study's open runs were marked KILLED: start a cluster and run "
            "the same command to continue",
            file=sys.stderr,
            flush=True,
        )
        self.exit(EXIT_STORE)
