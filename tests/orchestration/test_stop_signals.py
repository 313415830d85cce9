"""A stop signal is never lost: one that lands inside a garbage-collection callback still stops the study.

Python cannot raise out of a finalizer or a weakref callback (SQLAlchemy's ``_collection_gced`` runs often in
the driver): it prints "Exception ignored in: ..." and drops the exception. A handler that raised where it
landed so lost 2 of 11 signals sent to a running study, which then ran to its end and exited 0. The handler
now only requests the stop; safe points raise it (``core.uninterrupted``, ``orchestration.signals``).
"""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest

from lossscale_bench.core.uninterrupted import uninterrupted
from lossscale_bench.orchestration.signals import Interrupted, SignalsRaise


@pytest.fixture
def guard():
    g = SignalsRaise()
    g.install()
    yield g
    g.restore()


class _Collected:
    """An object whose collection runs a callback: the signal is delivered while that callback runs."""


def _signal_inside_a_finalizer(signum: int) -> None:
    def callback() -> None:
        os.kill(os.getpid(), signum)
        for _ in range(1000):  # the handler runs at one of these bytecodes, inside the callback
            pass

    obj = _Collected()
    weakref.finalize(obj, callback)
    cycle = [obj]
    cycle.append(cycle)  # collected by the garbage collector, not by reference counting
    del obj, cycle
    gc.collect()


def test_a_signal_inside_a_gc_callback_still_stops_at_the_next_safe_point(guard, capsys):
    calls = []
    with pytest.raises(Interrupted) as stop:
        _signal_inside_a_finalizer(signal.SIGTERM)
        for step in range(1, 21):  # a trial's store calls, one a step
            calls.append(step)
            with uninterrupted():
                pass
            time.sleep(0.01)
    assert stop.value.signum == signal.SIGTERM and calls == [1]
    assert "Exception ignored" not in capsys.readouterr().err


def test_a_long_blocking_wait_notices_the_signal_within_about_a_second(guard):
    """No safe point comes during a long wait (an evaluation, ``ray.init``): the watchdog raises it there."""
    t0 = time.monotonic()
    with pytest.raises(Interrupted):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    assert time.monotonic() - t0 < 10  # about FALLBACK_S; generous on a loaded machine
    with uninterrupted():  # taken: nothing is left pending for the next block
        pass


def test_the_fallback_raise_dropped_in_a_callback_is_requested_again(guard):
    """The watchdog's raise lands in a finalizer too: ``sys.unraisablehook`` requests the stop again."""
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + 10
    with pytest.raises(Interrupted):
        while time.monotonic() < deadline:  # finalizers running all the time, no safe point
            obj = _Collected()
            weakref.finalize(obj, lambda: [None for _ in range(2000)])
            del obj
        with uninterrupted():
            pass


# -- the study itself, through the CLI ------------------------------------------------------------------------

#: the study a stop signal was lost on: fp8 emulation, dynamic loss scaling, every step logged
REPRO = """\
name: stops
dataset: {name: synthetic, train_images: 16, val_images: 8, image_size: 64, seed: 0}
model: ssd_tiny
model_options: {width: 8}
batch_size: 4
precision: fp8-e4m3-emulated
scaling:
  - {method: dynamic, style: torch}
seeds: [0]
schedule: {iterations: 80, lr: 0.01, warmup_iterations: 2}
eval: {every: 40, metric: coco}
log_every: 1
"""


def stop_once(study: Path, runs: Path, signum: int, delay: float, timeout: float = 240) -> tuple[int, str, list]:
    """Run ``study`` with ``--executor local``, send ``signum`` to its process group ``delay`` s after its
    ``] start`` line; return (exit code, stderr, [(MLflow status, lsbench.status) of every run])."""
    from mlflow.tracking import MlflowClient

    cmd = [sys.executable, "-m", "lossscale_bench.cli", "run", str(study), "--executor", "local"]
    cmd += ["--runs-dir", str(runs), "--no-report"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, bufsize=1
    )
    try:
        for line in proc.stdout:
            if "] start" in line:
                break
        time.sleep(delay)
        if proc.poll() is None:
            os.killpg(proc.pid, signum)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("stops")
    runs_ = client.search_runs([exp.experiment_id]) if exp else []
    return proc.returncode, err, [(r.info.status, r.data.tags.get("lsbench.status")) for r in runs_]


@pytest.mark.slow
def test_every_stop_signal_stops_the_study(tmp_path):
    """Eight signals, SIGINT and SIGTERM, at spread moments of a running study: every one stops it with 130
    or 143, and no run is left RUNNING (``benchmarks/stop_signals.py`` sends fifty)."""
    from concurrent.futures import ThreadPoolExecutor

    study = tmp_path / "stops.yaml"
    study.write_text(REPRO)
    rng = random.Random(53)
    cases = [((signal.SIGINT, signal.SIGTERM)[i % 2], 0.1 + 5.4 * (i + rng.random()) / 8) for i in range(8)]
    with ThreadPoolExecutor(4) as pool:  # four studies at a time: each spends most of its time starting
        results = list(pool.map(lambda c: stop_once(study, tmp_path / f"runs{cases.index(c)}", *c), cases))
    for (signum, delay), (rc, err, runs) in zip(cases, results):
        want = 130 if signum == signal.SIGINT else 143
        assert rc == want, (signum, round(delay, 2), rc, err[-3000:])
        assert runs and all(status != "RUNNING" for status, _ in runs), (signum, round(delay, 2), runs)
        assert ("KILLED", "interrupted") in runs, (signum, round(delay, 2), runs)
