"""How trials end in the MLflow store and UI, on a real SQLite store.

One study, run in-process (``executor="local"``, no Ray), has a trial that
finishes, one forced to diverge (a 1e30 loss scale that does not skip
non-finite steps) and one forced to fail (a corrupt checkpoint in its trial
directory). Checked: diverged and failed runs do not end FINISHED (the green
tick) and carry their status in the run name, where the runs table shows it;
``lsbench.diverged_step`` names a step of the logged metric history; the
parent run's ``trials_*`` counts come from the store, so they stay true when
the study is resumed; the UI, in headless Chromium, shows all of it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from helpers import study_yaml
from lossscale_bench.orchestration.study_runner import run_study, study_dir
from lossscale_bench.study import load_study_text
from lossscale_bench.tracking.run_status import VIEW_COLUMNS, VIEW_TAG, view_url

STUDY = study_yaml(
    name="status",
    precision="fp16-emulated",
    scaling=[
        "{method: fixed, scale: 128}",
        "{method: fixed, scale: 1.0e+30, skip_nonfinite: false, label: blow-up}",
        "{method: dynamic, label: broken}",
    ],
    divergence={"patience": 3},
)


def _client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(client, exp_id):
    runs = client.search_runs([exp_id])
    trials = {r.data.tags["lsbench.label"]: r for r in runs if r.data.tags.get("lsbench.role") == "trial"}
    parent = [r for r in runs if r.data.tags.get("lsbench.role") == "study"]
    assert len(parent) == 1
    return trials, parent[0]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The study run once: finished, diverged (blow-up), failed (broken: corrupt checkpoint)."""
    runs = tmp_path_factory.mktemp("status") / "runs"
    study = load_study_text(STUDY)
    broken = [c for c in study.trials() if c.label == "broken"][0]
    ckpt = study_dir(runs, study.name) / "trials" / broken.trial_id / "checkpoint.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"not a checkpoint")
    result = run_study(study, runs_dir=runs, executor="local", quiet=True)
    assert sorted(o["status"] for o in result.outcomes.values()) == ["diverged", "failed", "finished"]
    client = _client(result.tracking_uri)
    exp_id = client.get_experiment_by_name(study.name).experiment_id
    return {"study": study, "runs": runs, "uri": result.tracking_uri, "client": client, "exp_id": exp_id, "ckpt": ckpt}


def test_diverged_and_failed_runs_are_not_a_green_tick_and_say_so_in_the_runs_table(store):
    trials, _ = _runs(store["client"], store["exp_id"])
    ok, div, bad = trials["loss scale (128)"], trials["blow-up"], trials["broken"]
    tid = {k: r.data.tags["lsbench.trial_id"] for k, r in trials.items()}

    # not FINISHED (the green tick of a healthy run): MLflow's red cross
    assert ok.info.status == "FINISHED"
    assert div.info.status == "FAILED" and div.data.tags["lsbench.status"] == "diverged"
    assert ok.info.run_name == f"loss scale (128) | {tid['loss scale (128)']}"
    assert ok.data.tags["mlflow.note.content"].startswith("**finished**: final mAP ")

    # and the run name (always shown) leads with the status; the description says why and where
    assert div.info.run_name == f"[diverged] blow-up | {tid['blow-up']}"
    assert div.data.tags["mlflow.runName"] == div.info.run_name
    step = div.data.tags["lsbench.diverged_step"]
    assert div.data.tags["mlflow.note.content"].startswith(f"**diverged** at step {step}: ")

    assert bad.info.status == "FAILED" and bad.data.tags["lsbench.status"] == "failed"
    assert bad.info.run_name == f"[failed] broken | {tid['broken']}"
    assert bad.data.tags["mlflow.note.content"].startswith("**failed**: ")
    assert "CheckpointError" in bad.data.tags["mlflow.note.content"]

    # the columns a researcher needs are values of every trial run, under readable names
    for r in trials.values():
        assert {"lsbench.label", "lsbench.status"} <= set(r.data.tags)
        assert "skipped_steps" in r.data.metrics or r is bad  # failed before its first step
    assert 0.0 <= ok.data.metrics["final_map"] <= 1.0 and "final_map" not in div.data.metrics


def test_diverged_step_is_a_step_of_the_logged_metric_history(store):
    """The tag names the step that applied the non-finite gradient: its own metrics say so
    (overflow 1, skipped 0), its loss is the last finite one, every later loss is non-finite.
    (It used to name the next step, the first NaN loss: one past the step that broke training.)"""
    client = store["client"]
    trials, _ = _runs(client, store["exp_id"])
    div = trials["blow-up"]
    step = int(div.data.tags["lsbench.diverged_step"])

    def history(key):
        return {m.step: m.value for m in client.get_metric_history(div.info.run_id, key)}

    loss, overflow, skipped = history("loss"), history("overflow"), history("skipped")
    assert step in loss, (step, sorted(loss))
    assert overflow[step] == 1.0 and skipped[step] == 0.0
    assert math.isfinite(loss[step])
    assert loss[step] == pytest.approx(float(div.data.tags["lsbench.last_finite_loss"]), rel=1e-5)
    later = [v for s, v in loss.items() if s > step]
    assert later and not any(math.isfinite(v) for v in later)
    assert all(math.isfinite(v) for s, v in loss.items() if s < step)
    assert f"applied at step {step}" in div.data.tags["lsbench.diverged_reason"]


def test_diverged_step_without_an_applied_overflow_is_the_first_non_finite_loss(tmp_path):
    """A skipping scaler never applies a non-finite gradient: the first NaN loss (a skipped step)
    is the step named."""
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.trial import run_trial

    text = STUDY.replace("lr: 0.01, warmup_iterations: 2", "lr: 1.0e+6, warmup_iterations: 0")
    cfg = [c for c in load_study_text(text).trials() if c.label == "broken"][0]
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=tmp_path)
    assert out.status == "diverged"
    loss = dict(sink.history("loss"))
    first_nan = min(s for s, v in loss.items() if not math.isfinite(v))
    assert out.diverged_step == sink.tag_values["lsbench.diverged_step"] == first_nan
    assert dict(sink.history("skipped"))[first_nan] == 1.0


def test_parent_counts_come_from_the_store_after_resumes(store):
    """Resumed, the parent run counts every trial of the study, not only this invocation's."""
    client, study = store["client"], store["study"]
    _, parent = _runs(client, store["exp_id"])
    assert parent.data.metrics["trials_finished"] == 1
    assert parent.data.metrics["trials_diverged"] == 1 and parent.data.metrics["trials_failed"] == 1
    first_status = parent.info.status

    # the broken trial is mended and re-run: its run continues, finishes, loses its [failed] name
    store["ckpt"].unlink()
    second = run_study(study, runs_dir=store["runs"], executor="local", quiet=True)
    assert [o["status"] for o in second.outcomes.values()] == ["finished"]
    trials, parent = _runs(client, store["exp_id"])
    assert len(trials) == 3
    assert trials["broken"].info.status == "FINISHED"
    assert trials["broken"].info.run_name == f"broken | {trials['broken'].data.tags['lsbench.trial_id']}"
    second_status = parent.info.status

    # fully finished: a third invocation runs nothing and still counts all of it
    third = run_study(study, runs_dir=store["runs"], executor="local", quiet=True)
    assert third.outcomes == {} and len(third.skipped) == 3
    _, parent = _runs(client, store["exp_id"])
    m = parent.data.metrics
    assert m["trials_finished"] == 2  # was 0: only this invocation's outcomes were counted
    assert (m["trials_finished"], m["trials_diverged"], m["trials_failed"], m["trials_pending"], m["trials_total"]) == (
        2,
        1,
        0,
        0,
        3,
    )
    assert parent.data.tags["lsbench.trials"] == "2 finished, 1 diverged, 0 failed, 0 pending"
    # the parent ends FAILED while a trial of the study is failed (lsbench run exits 3 then)
    assert (first_status, second_status, parent.info.status) == ("FAILED", "FINISHED", "FINISHED")


def test_experiment_carries_the_model_training_kind_and_the_saved_view(store):
    exp = store["client"].get_experiment(store["exp_id"])
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(exp.tags[VIEW_TAG])
    assert view["selectedColumns"] == list(VIEW_COLUMNS)
    assert {"tags.`lsbench.label`", "tags.`lsbench.status`", "metrics.`final_map`", "metrics.`skipped_steps`"} <= set(
        view["selectedColumns"]
    )
    assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "lsbench.status"}]


def _find_chromium():
    for name in (os.environ.get("LSBENCH_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(_find_chromium() is None, reason="no chromium on PATH (apt-get install -y chromium)")
def test_the_ui_runs_table_shows_status_and_columns(store, tmp_path):
    """The MLflow UI itself (server + headless Chromium): the link ``lsbench ui`` prints opens the
    model-training runs table with the trials grouped by status and lsbench's columns."""
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            store["uri"],
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        import urllib.request

        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, "mlflow server did not start"
                time.sleep(0.5)
        url = view_url(f"http://127.0.0.1:{port}", store["exp_id"])
        dom = subprocess.run(
            [
                _find_chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--window-size=1900,900",
                "--virtual-time-budget=25000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    trials, _ = _runs(store["client"], store["exp_id"])
    assert "Model training" in dom
    for label in ("blow-up", "broken", "loss scale (128)"):
        assert trials[label].info.run_name in dom, label  # every trial row, flat, named with its status
    assert "[diverged] blow-up" in dom
    for text in ("Group: finished", "Group: diverged", "final_map", "skipped_steps", "lsbench.status", "lsbench.label"):
        assert text in dom, text


def test_a_resumed_parent_run_loses_its_interrupted_tag(tmp_path):
    """SIGTERM tags the parent ``lsbench.status=interrupted``; the re-run that completes the study ends
    it FINISHED, and the tag (a runs-table column) must say so too, not ``interrupted`` for ever."""
    from lossscale_bench.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    _, parent = tracker.study_run("interrupted_parent")
    tracker.end_interrupted(parent)
    assert tracker.client.get_run(parent).data.tags["lsbench.status"] == "interrupted"
    _, again = tracker.study_run("interrupted_parent")  # the re-run reopens the same parent
    assert again == parent
    tracker.end_study(parent, [])
    run = tracker.client.get_run(parent)
    assert (run.info.status, run.data.tags["lsbench.status"]) == ("FINISHED", "finished")


TAIL_NAN = study_yaml(
    name="tail_nan",
    dataset={"name": "synthetic", "train_images": 8, "val_images": 4, "image_size": 64, "seed": 0},
    model_options={"width": 8, "image_size": 64},
    batch_size=2,
    precision="fp16-emulated",
    scaling=["{method: fixed, scale: 1.0e+30, skip_nonfinite: false, label: tail-nan}"],
    schedule={"iterations": 3, "lr": 0.01, "warmup_iterations": 0},
)


def test_a_loss_gone_non_finite_within_patience_of_the_end_is_diverged_not_a_zero_map(tmp_path):
    """Divergence is data, never a wrong number: 3 iterations, default patience 10.
    Step 1 applies a non-finite gradient, steps 2-3 lose to NaN: fewer than ``patience`` bad
    steps, but training ended on them. The trial used to end ``finished`` with mAP 0.00 (a number
    that was averaged with other seeds); it must end ``diverged``, with no final mAP, naming the
    step that broke training. Windows of ``log_every`` 2 leave step 3 alone in a partial window."""
    study = load_study_text(TAIL_NAN)
    result = run_study(study, runs_dir=tmp_path / "runs", executor="local", quiet=True)
    (out,) = result.outcomes.values()
    assert out["status"] == "diverged" and out["final_map"] is None
    client = _client(result.tracking_uri)
    trials, _ = _runs(client, client.get_experiment_by_name(study.name).experiment_id)
    run = trials["tail-nan"]
    assert run.info.status == "FAILED" and run.data.tags["lsbench.status"] == "diverged"
    assert "final_map" not in run.data.metrics and "map" not in run.data.metrics
    loss = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    overflow = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "overflow")}
    skipped = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "skipped")}
    assert sorted(loss) == [1, 2, 3]
    step = int(run.data.tags["lsbench.diverged_step"])
    assert step == out["diverged_step"]
    # the step that applied the non-finite update: its loss is the last finite one, every later one NaN
    assert overflow[step] == 1.0 and skipped[step] == 0.0 and math.isfinite(loss[step])
    assert loss[step] == pytest.approx(float(run.data.tags["lsbench.last_finite_loss"]), rel=1e-5)
    assert [s for s, v in loss.items() if not math.isfinite(v)] == [s for s in loss if s > step] != []


@pytest.mark.parametrize("iterations,policy", [(1, "stop"), (3, "continue")])
def test_non_finite_weights_at_the_end_or_policy_continue(tmp_path, iterations, policy):
    """One iteration: the only loss is finite, but its update was non-finite, so the weights
    are: diverged at step 1, no mAP. ``on_divergence: continue`` keeps its meaning: the trial
    is ``diverged`` and still evaluated to a final mAP."""
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.trial import run_trial

    text = TAIL_NAN.replace("iterations: 3", f"iterations: {iterations}") + f"on_divergence: {policy}\n"
    (cfg,) = load_study_text(text).trials()
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=tmp_path)
    assert out.status == "diverged" == sink.tag_values["lsbench.status"]
    assert out.diverged_step == sink.tag_values["lsbench.diverged_step"] == 1
    if policy == "stop":
        assert out.final_map is None and not sink.history("final_map")
        assert "weights" in out.diverged_reason
    else:
        assert out.final_map is not None and sink.history("final_map")
        assert "ended" in out.diverged_reason
