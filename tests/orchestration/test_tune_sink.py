"""The trial's sink inside Ray Tune holds periodic reports back (orchestration/tune_sink.py).

Why: Ray's function trainable reports synchronously, so every report stalls training until the driver has
handled it; the sink reports at ``flush_when_due`` points only every ``interval`` seconds, and at once on an
explicit ``flush`` (a checkpoint, the trial's end). The Ray path itself (reports reaching MLflow, a killed
worker resumed with no step lost or logged twice) is tested end to end in test_resume.py and test_e2e.py."""

from __future__ import annotations

import json

from lossscale_bench.orchestration.tune_sink import TuneSink


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_periodic_reports_wait_for_the_interval_and_explicit_ones_do_not():
    sent, clock = [], _Clock()
    sink = TuneSink(report=sent.append, clock=clock, interval=2.0)
    sink.metrics([("loss", 1.0, 10)])
    sink.flush_when_due()  # the first is not held: the driver sees the trial running at once
    assert len(sent) == 1
    sink.metrics([("loss", 0.9, 20)])
    clock.now += 1.9
    sink.flush_when_due()  # held: 1.9 s since the last report returned
    assert len(sent) == 1
    sink.metrics([("loss", 0.8, 30)])
    clock.now += 0.1
    sink.flush_when_due()  # due: both held batches go in one report, in order
    assert len(sent) == 2
    assert json.loads(sent[1]["lsbench"])["metrics"] == [["loss", 0.9, 20], ["loss", 0.8, 30]]
    sink.metrics([("loss", 0.7, 40)])
    sink.flush()  # explicit (a checkpoint): at once
    assert len(sent) == 3 and sent[2]["lsbench_reports"] == 3
    sink.flush_when_due()  # nothing buffered: nothing sent
    clock.now += 10
    sink.flush_when_due()
    assert len(sent) == 3
    sink.flush(outcome={"status": "finished"})  # the trial's end: the outcome alone is a report
    assert len(sent) == 4 and json.loads(sent[3]["lsbench"])["outcome"] == {"status": "finished"}
