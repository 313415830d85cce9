"""One trial in-process (no Ray): divergence policies, checkpoints, bad checkpoints, write failures."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest

from helpers import crash_and_resume, study_yaml
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.study import load_study_text
from lossscale_bench.trial import run_trial

BLOWUP = "{method: fixed, scale: 1.0e+30, skip_nonfinite: false}"


def _study(scaling="{method: fixed, scale: 128}", iterations=6, every="null", policy="stop", precision="fp16-emulated"):
    """The base study in fp16-emulated with one scaling row, divergence after 3 bad steps."""
    return study_yaml(
        precision=precision,
        scaling=[scaling],
        schedule={"iterations": iterations, "lr": 0.01, "warmup_iterations": 2},
        eval={"every": every, "metric": "coco"},
        divergence={"patience": 3},
        on_divergence=policy,
    )


def _cfg(scaling="{method: fixed, scale: 128}", iterations=6, every="null", policy="stop", precision="fp16-emulated"):
    return load_study_text(_study(scaling, iterations, every, policy, precision)).trials()[0]


def test_divergence_stop_is_a_status_with_step_loss_and_scale(tmp_path):
    sink = MemorySink()
    out = run_trial(_cfg(BLOWUP, iterations=20), sink=sink, trial_dir=tmp_path)
    assert out.status == "diverged"
    assert out.steps < 20 and out.diverged_step == sink.tag_values["lsbench.diverged_step"]
    assert sink.tag_values["lsbench.status"] == "diverged"
    assert sink.tag_values["lsbench.diverged_scale"] == 1e30
    assert "lsbench.last_finite_loss" in sink.tag_values
    assert out.final_map is None


def test_divergence_continue_runs_to_the_end(tmp_path):
    sink = MemorySink()
    out = run_trial(_cfg(BLOWUP, iterations=8, policy="continue"), sink=sink, trial_dir=tmp_path)
    assert out.status == "diverged" and out.steps == 8
    assert out.diverged_step is not None
    assert [s for s, _ in sink.history("loss")] == list(range(1, 9))
    assert any(not math.isfinite(v) for _, v in sink.history("loss"))


def test_finished_trial_logs_every_step_and_final_map(tmp_path):
    sink = MemorySink()
    out = run_trial(_cfg(iterations=6, every=3), sink=sink, trial_dir=tmp_path)
    assert out.status == "finished", out.error
    assert [s for s, _ in sink.history("loss")] == [1, 2, 3, 4, 5, 6]
    assert {v for _, v in sink.history("loss_scale")} == {128.0}
    assert [s for s, _ in sink.history("map")] == [3, 6]
    assert sink.history("final_map") and sink.history("underflow_rate_mean")
    assert any(a.endswith("layers_history.csv") for a, _ in sink.artifacts)
    assert not (tmp_path / "checkpoint.pt").exists()


def test_resume_from_checkpoint_continues_at_the_saved_step(tmp_path):
    cfg = _cfg(iterations=6, every=3)
    # a first run that stops at step 3 leaves a checkpoint, as a killed process would
    import lossscale_bench.trial as trial_mod
    from lossscale_bench.engine.hooks import CheckpointHook

    class Kill(Exception):
        pass

    orig = CheckpointHook.after_step

    def after_step(self, trainer, record):
        orig(self, trainer, record)
        if record.step == 3:
            raise Kill()

    CheckpointHook.after_step = after_step
    try:
        out = run_trial(cfg, sink=MemorySink(), trial_dir=tmp_path)
    finally:
        CheckpointHook.after_step = orig
    assert out.status == "failed" and "Kill" in out.error
    assert (tmp_path / "checkpoint.pt").exists()
    sink = MemorySink()
    out = trial_mod.run_trial(cfg, sink=sink, trial_dir=tmp_path)
    assert out.status == "finished"
    assert sink.tag_values["lsbench.resumed_from_step"] == 3
    assert [s for s, _ in sink.history("loss")] == [4, 5, 6]


def test_truncated_checkpoint_fails_clearly(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"PK\x03\x04 truncated")
    out = run_trial(_cfg(), sink=MemorySink(), trial_dir=tmp_path)
    assert out.status == "failed"
    assert "checkpoint" in out.error and "cannot be read" in out.error and "delete it" in out.error
    # the terminal's progress line shows the first 200 characters: the advice must be among them
    assert "delete it" in out.error[:200] and str(tmp_path / "checkpoint.pt") in out.error


def test_full_disk_while_checkpointing_fails_the_trial_with_the_os_error(tmp_path):
    """A real write failure: RLIMIT_FSIZE makes the checkpoint write fail (EFBIG), as a full disk would."""
    code = textwrap.dedent(f"""
        import resource, signal, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from lossscale_bench.engine.sink import MemorySink
        from lossscale_bench.study import load_study_text
        from lossscale_bench.trial import run_trial
        from lossscale_bench.data.synthetic import ensure_synthetic
        ensure_synthetic(train_images=16, val_images=4, image_size=64, seed=0)   # data first, then the limit
        cfg = load_study_text({_study(iterations=4, every=2)!r}).trials()[0]
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
        out = run_trial(cfg, sink=MemorySink(), trial_dir={str(tmp_path / "trial")!r})
        print("STATUS", out.status, out.error)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "STATUS failed" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "File too large" in r.stdout or "No space" in r.stdout
    assert not list((tmp_path / "trial").glob("checkpoint.pt*"))  # no half-written checkpoint left


def _losses_and_map(cfg, trial_dir, threads):
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=trial_dir, threads=threads)
    assert out.status == "finished", out.error
    return [v for _, v in sink.history("loss")], out.final_map


@pytest.mark.parametrize("precision", ["fp32", "fp8-emulated"])
def test_same_trial_twice_gives_bit_identical_losses_and_map(tmp_path, precision):
    """Determinism: same trial id, same machine, same thread count -> the same numbers.

    Data order and flips are seeded per trial, no DataLoader workers run, and CPU kernels are
    deterministic at a fixed thread count; `threads` is pinned from `cpus_per_trial` in a sweep.
    """
    import torch

    before = torch.get_num_threads()
    try:
        cfg = _cfg(iterations=8, precision=precision)
        a = _losses_and_map(cfg, tmp_path / "a", threads=1)
        b = _losses_and_map(cfg, tmp_path / "b", threads=1)
    finally:
        torch.set_num_threads(before)
    assert a[0] == b[0] and len(a[0]) == 8
    assert a[1] == b[1]


def test_resumed_trial_ends_bit_identical_to_an_uninterrupted_one(tmp_path, monkeypatch):
    """Determinism across a resume: a trial stopped after its step-4 checkpoint and run
    again from it logs the same losses and the same final mAP as one that never stopped."""
    cfg = _cfg("{method: dynamic, interval: 2}", iterations=8, precision="fp8-emulated")

    def crashed(out):
        assert out.status == "failed" and (tmp_path / "b" / "checkpoint.pt").exists()

    (a, straight), (_, first), (b, second) = crash_and_resume(cfg, tmp_path, monkeypatch, after_crash=crashed)
    assert a.status == b.status == "finished"
    assert second.tag_values["lsbench.resumed_from_step"] == 4
    resumed = dict(first.history("loss")[:4] + second.history("loss"))
    assert resumed == dict(straight.history("loss"))
    assert a.final_map == b.final_map


_FRESH = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[2])
    from helpers import study_yaml
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.study import load_study_text
    from lossscale_bench.trial import run_trial
    cfg = load_study_text(sys.argv[1]).trials()[0]
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=sys.argv[3], threads=1)
    print(json.dumps([[v for _, v in sink.history("loss")], out.final_map]))
""")


def test_trial_in_a_reused_worker_matches_a_fresh_process(tmp_path):
    """Ray Tune reuses worker processes (``reuse_actors``): a trial that runs after another trial in
    the same process must train exactly as it does alone in a fresh one (same losses, same mAP).
    What could leak: RNG state, torch's thread count, the compiled rounding kernels and their
    caches, the data set cache, hooks left on modules. E4M3 gradients, so the compiled kernels and
    the batched parameter-gradient rounding are on the path; the first trial is adaptive on another
    seed, so it leaves per-layer scaler state and a different RNG position behind."""
    import json
    from pathlib import Path

    import torch

    target = _study("{method: fixed, scale: 128}", iterations=8, precision="fp8-e4m3-emulated")
    other = study_yaml(
        precision="fp8-e4m3-emulated",
        scaling=["{method: adaptive}"],
        seeds=[5],
        schedule={"iterations": 5, "lr": 0.01, "warmup_iterations": 2},
        eval={"every": "null", "metric": "coco"},
    )
    before = torch.get_num_threads()
    try:
        _losses_and_map(load_study_text(other).trials()[0], tmp_path / "other", threads=2)
        reused = _losses_and_map(load_study_text(target).trials()[0], tmp_path / "reused", threads=1)
    finally:
        torch.set_num_threads(before)
    tests_dir = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", _FRESH, target, tests_dir, str(tmp_path / "fresh")],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(reused[0]) == 8
    assert reused[0] == fresh[0]
    assert reused[1] == fresh[1]


class _HoldingSink(MemorySink):
    """A sink that delivers only on an explicit flush (as TuneSink does between its reports): what it has
    delivered is what a driver would have, were the trial killed now."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered: list[tuple[str, float, int]] = []

    def flush(self):
        super().flush()
        self.delivered = list(self.items)

    def flush_when_due(self):
        pass  # never due: only explicit flushes deliver


def test_every_step_before_a_checkpoint_is_delivered_before_the_checkpoint_is_written(tmp_path, monkeypatch):
    # a trial resumed from a checkpoint recomputes only the steps after it, so a sink that holds reports back
    # (TuneSink) must have delivered everything logged up to it by then (it reports every few seconds)
    from lossscale_bench.engine import hooks

    sink, seen = _HoldingSink(), []
    real_save = hooks.atomic_torch_save

    def save(obj, path):
        seen.append(
            (
                obj["step"] if "step" in obj else obj["state"]["step"],
                max((s for k, _, s in sink.delivered if k == "loss"), default=0),
            )
        )
        real_save(obj, path)

    monkeypatch.setattr(hooks, "atomic_torch_save", save)
    out = run_trial(_cfg(iterations=12), sink=sink, trial_dir=tmp_path, checkpoint_every=4)
    assert out.status == "finished", out.error
    assert [step for step, _ in seen] == [4, 8, 12]
    assert all(delivered == step for step, delivered in seen), seen
    assert [s for k, _, s in sink.delivered if k == "loss"] == list(range(1, 13))  # the trial's end delivers all
