"""Serving the MLflow UI (``lsbench ui``): the port check and the server's process group.

Why apart from the CLI: starting ``mlflow server`` safely is process management (a port
checked before the server can die on it, a process group stopped as a whole, the cause of an
early death named in one line), the same for whoever serves a store, and it kept ``cli.py``
past the size a module with one job should have.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..core.exit_codes import EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (``port 5000 is in use``), or None."""
    import errno
    import socket

    try:
        fam, typ, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror:
        return f"--host {host}: the name does not resolve"
    with socket.socket(fam, typ, proto) as s:
        # as the server will: a closed connection's TIME_WAIT is no obstacle, a listener is
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} is in use on {host} (another lsbench ui or mlflow server?); choose one with --port"
            return f"cannot listen on {host} port {port}: {exc.strerror or exc}"
    return None


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still lives (zombies aside: nothing to stop there)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def _stop_group(pgid: int, popen, grace: float = 10.0) -> None:
    """SIGTERM to the whole process group, SIGKILL to what is left after ``grace`` seconds."""
    import signal
    import time

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            popen.poll()  # reap the server itself
            if not _group_alive(pgid):
                return
            time.sleep(0.1)


def serve(cmd: list[str], port: int) -> int:
    """Run the MLflow server in a process group of its own and stop all of it on the way out.

    ``mlflow server`` starts worker processes; ending only the process we started
    would leave them serving. So the server gets its own session (Ctrl-C in the
    terminal no longer reaches it directly): SIGINT/SIGTERM here, an error, or the
    server dying early all end in :func:`_stop_group`. Its stderr is passed
    through and its tail kept, to say in one line why it died.
    """
    import collections
    import signal
    import subprocess
    import threading

    tail: collections.deque[str] = collections.deque(maxlen=40)
    got: list[int] = []

    def on_signal(signum, frame):
        got.append(signum)
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    proc = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.PIPE, text=True, errors="replace")

    def pump():
        for line in proc.stderr:
            tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    rc = None
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # the group is being stopped: no second interruption of that
        _stop_group(proc.pid, proc)
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        return EXIT_SIGTERM if got[0] == signal.SIGTERM else EXIT_SIGINT
    pumper.join(timeout=2)
    if rc:
        text = "".join(tail)
        if "address already in use" in text.lower() or "errno 98" in text.lower():
            why = f"port {port} is in use"
        else:
            last = [ln.strip() for ln in tail if ln.strip()]
            why = last[-1][:300] if last else "no message"
        print(f"lsbench: error: the MLflow server exited with code {rc}: {why}", file=sys.stderr)
        return EXIT_USAGE if why.startswith("port ") else rc
    return rc or 0
