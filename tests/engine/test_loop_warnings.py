"""Warnings lsbench causes itself do not reach the user's terminal (torch's scheduler-order
warning after a skipped first step was printed by every trial whose scaler skipped step 1)."""

from __future__ import annotations

import warnings

from helpers import study_yaml
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.study import load_study_text
from lossscale_bench.trial import run_trial


def test_a_skipped_first_step_raises_no_scheduler_order_warning(tmp_path):
    study = load_study_text(
        study_yaml(
            precision="fp16-emulated",
            scaling=["{method: fixed, scale: 1.0e+30}"],
            schedule={"iterations": 3, "lr": 0.01, "warmup_iterations": 1},
        ),
        "s.yaml",
    )
    sink = MemorySink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = run_trial(study.trials()[0], sink=sink, trial_dir=tmp_path, threads=1)
    assert outcome.status in ("finished", "diverged")
    assert sink.history("skipped")[0][1] == 1  # step 1 really was skipped (the warning's cause)
    texts = [str(w.message) for w in caught]
    assert not [t for t in texts if "lr_scheduler.step()" in t], texts
