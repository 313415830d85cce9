"""The head watch (``orchestration.head_watch``) on a real socket: a head that stops answering ends the study
with the open runs closed, one line and exit 4; one that answers is left alone.
The socket stands for the head's GCS port, which is what the watch probes."""

from __future__ import annotations

import socket
import time

from lossscale_bench.orchestration.head_watch import HeadWatch


def _listening():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def test_a_head_that_stops_answering_closes_the_runs_and_exits_4(capsys):
    sock, address = _listening()
    events = []
    watch = HeadWatch(address, lambda: events.append("closed"), lost_after=0.6, every=0.1, exit=events.append)
    watch.start()
    time.sleep(1.0)
    assert events == []  # it answers: nothing happens
    sock.close()
    deadline = time.monotonic() + 10
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert events == ["closed", 4]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lsbench: error: the Ray cluster's head at " + address), lines


def test_a_stopped_watch_does_nothing(capsys):
    sock, address = _listening()
    events = []
    watch = HeadWatch(address, lambda: events.append("closed"), lost_after=0.2, every=0.05, exit=events.append)
    watch.start()
    watch.stop()
    sock.close()
    time.sleep(0.6)
    assert events == [] and capsys.readouterr().err == ""
