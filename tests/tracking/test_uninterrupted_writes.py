"""A stop signal never cuts a store call in half: Ctrl-C during a write still lets the runs be marked KILLED.

Raised inside an MLflow write on SQLite, the driver's ``Interrupted`` could leave the write's connection
holding the database lock: marking the runs KILLED then waited minutes and failed "database is locked"
(seen as a Ctrl-C test that hung, and one that ended in a traceback). The signal is now raised when the
store call returns (``core.uninterrupted``).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import threading
import time

import pytest

from lossscale_bench.core.uninterrupted import WholeCalls, uninterrupted
from lossscale_bench.orchestration.signals import Interrupted, SignalsRaise


@pytest.fixture
def guard():
    g = SignalsRaise()
    g.install()
    yield g
    g.restore()


def test_a_signal_inside_a_block_is_raised_when_the_outermost_block_ends(guard):
    done = []
    with pytest.raises(Interrupted):
        with uninterrupted():
            with uninterrupted():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the handler has run by now (between two bytecodes of this thread)
                done.append("inner")
            done.append("outer")
        done.append("after")  # not reached: the raise comes as the outer block ends
    assert done == ["inner", "outer"]
    assert guard.received == signal.SIGINT


def test_outside_a_block_the_signal_raises_within_about_a_second(guard):
    with pytest.raises(Interrupted):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # interrupted long before this ends (the watchdog's fallback, SignalsRaise.FALLBACK_S)
    with uninterrupted():  # and nothing is left pending for the next block
        pass


def test_whole_calls_finish_each_method_call_before_the_signal(guard):
    class Store:
        uri = "sqlite:///x.db"
        written: list[int] = []

        def write(self, x):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            self.written.append(x)
            return x

    s = WholeCalls(Store())
    assert s.uri == "sqlite:///x.db" and s.write.__self__ is s.wrapped
    with pytest.raises(Interrupted):
        s.write(3)
    assert Store.written == [3]


def test_signals_at_random_moments_of_store_writes_leave_the_store_writable(tmp_path, guard):
    """Forty signals, each at a random moment of a loop of the writes a trial makes (metrics, tags):
    every time the run is then marked KILLED at once, as ``run_study`` does after Ctrl-C."""
    from lossscale_bench.tracking.tracker import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = tracker.experiment_id("writes")
    rng = random.Random(0)
    for _ in range(40):
        run = tracker.client.create_run(exp).info.run_id
        step = 0
        with pytest.raises(Interrupted):
            threading.Timer(rng.uniform(0.0, 0.15), os.kill, (os.getpid(), signal.SIGINT)).start()
            while True:
                tracker.log_metrics(run, [("loss", 1.0, step), ("loss_scale", 2.0, step)])
                tracker.set_tags(run, {"lsbench.step": step})
                step += 1
        guard.hold()
        t0 = time.monotonic()
        tracker.end_interrupted(run)
        assert time.monotonic() - t0 < 5, "the store stayed locked after the signal"
        guard.install()
        got = tracker.client.get_run(run)
        assert (got.info.status, got.data.tags["lsbench.status"]) == ("KILLED", "interrupted")
        assert got.data.tags.get("lsbench.step") in (None, str(step - 1), str(step))


def test_only_a_database_store_gets_whole_calls(tmp_path):
    """An MLflow server's request cut in half harms nothing, and one that hangs must stay interruptible."""
    from mlflow.tracking import MlflowClient

    from lossscale_bench.tracking.client import store_client

    db, server = store_client(f"sqlite:///{tmp_path / 'mlflow.db'}"), store_client("http://127.0.0.1:9")
    assert isinstance(db, WholeCalls) and db.whole
    # a server's calls end at a safe point but are not made whole
    assert isinstance(server, WholeCalls) and not server.whole and type(server.wrapped) is MlflowClient


def test_a_store_that_stays_locked_is_one_line(tmp_path):
    """After the retries, "database is locked" is a StoreError naming the store, not a traceback."""
    from lossscale_bench.tracking.store import StoreError
    from lossscale_bench.tracking.store_faults import store_error

    db = tmp_path / "mlflow.db"
    holder = sqlite3.connect(db)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError) as locked:
            sqlite3.connect(db, timeout=0).execute("BEGIN IMMEDIATE")
    finally:
        holder.rollback()
    fault = store_error(locked.value, f"sqlite:///{db}")
    assert isinstance(fault, StoreError) and str(db) in str(fault) and "stayed locked" in str(fault)
