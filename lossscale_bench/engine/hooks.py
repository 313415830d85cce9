"""Hooks around the loop: metrics, divergence, evaluation, checkpoints.

Each hook has one job and sees the ``Trainer`` and each ``StepRecord``. A
diverged trial is data: ``DivergenceHook`` ends the loop with
``TrialDiverged`` (policy ``stop``) or records the step and lets it run on
(policy ``continue``); the trial turns that into a status, never a crash.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .loop import StepRecord, StopTraining, read_records
from .sink import Sink


class Hook:
    def before_train(self, trainer) -> None:
        pass

    def before_step(self, trainer, step: int) -> None:
        """``step`` is the 1-based number the coming step will have."""

    def after_step(self, trainer, record: StepRecord) -> None:
        pass

    def after_train(self, trainer) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """What the hook must carry across a resume (detectron2's hooks have the same pair)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class StopCheck(Hook):
    """Calls ``check()`` before every step: where a caller that can be told to stop the trial from outside
    (the study driver running it in its own process, on a stop signal) raises. The loop knows nothing of why."""

    def __init__(self, check: Callable[[], None]) -> None:
        self.check = check

    def before_step(self, trainer, step: int) -> None:
        self.check()


class TrialDiverged(StopTraining):
    def __init__(self, step: int, last_finite_loss: float | None, scale: float, reason: str):
        super().__init__(f"diverged at step {step}: {reason}")
        self.step = step
        self.last_finite_loss = last_finite_loss
        self.scale = scale
        self.reason = reason


class MetricsHook(Hook):
    """Logs every step's loss, scale, overflow, skip count, lr and throughput; flushes every ``log_every``.

    The losses are read from the device only then, a window at a time (``read_records``): a
    step's loss need not reach the host when the step ends (loop.py's module doc).
    """

    def __init__(self, sink: Sink, log_every: int = 10) -> None:
        self.sink = sink
        self.log_every = max(1, int(log_every))
        self._buf: list[tuple[str, float, int]] = []
        self._pending: list[tuple[StepRecord, list[tuple[str, float, int]]]] = []

    @staticmethod
    def _finite_or_none(x: float) -> float:
        # MLflow stores nan/inf, but keep them visible as such: no clamping.
        return float(x)

    def after_step(self, trainer, record: StepRecord) -> None:
        s = record.step
        st = trainer.state
        # what is known on the host now (the running skip count must be this step's)
        items = [
            ("lr", record.lr, s),
            ("overflow", float(record.result.overflow), s),
            ("skipped", float(record.result.skipped), s),
            ("skipped_steps", float(st.skipped_steps), s),
        ]
        if s % self.log_every == 0 or s == trainer.iterations:
            # Per-layer summaries need a host read: only on logged steps.
            items += [(k, float(v), s) for k, v in trainer.scaler.metrics().items()]
        else:
            items.append(("loss_scale", float(record.result.scale), s))
        self._pending.append((record, items))
        if s % self.log_every == 0:
            self._deliver()
            self.sink.flush_when_due()  # a sink may hold it for a later report (tune_sink.REPORT_INTERVAL_S)
        elif s == trainer.iterations:
            self._drain()

    def _drain(self) -> None:
        """Read the pending steps' losses (one transfer) and queue every pending metric."""
        read_records(r for r, _ in self._pending)
        for record, items in self._pending:
            s = record.step
            self._buf.append(("loss", self._finite_or_none(record.loss), s))
            self._buf.extend(items)
            self._buf.append(("images_per_sec", record.images_per_sec, s))
            self._buf.extend((f"loss_{k}", v, s) for k, v in record.parts.items())
        self._pending = []

    def _deliver(self) -> None:
        """Hand every pending and queued metric to the sink."""
        self._drain()
        if self._buf:
            self.sink.metrics(self._buf)
            self._buf = []

    def flush(self, trainer=None) -> None:
        self._deliver()
        self.sink.flush()

    def after_train(self, trainer) -> None:
        stats = trainer.backend.memory_stats()
        if stats:
            self._buf.extend((k, float(v), trainer.state.step) for k, v in stats.items())
        self.flush(trainer)


#: below this a loss scale has collapsed (the smallest normal fp32; DivergenceHook._check_scale)
SCALE_FLOOR = float(torch.finfo(torch.float32).tiny)


class DivergenceHook(Hook):
    """Declares divergence after ``patience`` consecutive non-finite losses or
    ``max_consecutive_skips`` consecutive skipped steps (a scale that can never recover).

    ``diverged_step`` is a step number of the metric history (``StepRecord.step``,
    the step under which ``loss``, ``overflow`` and ``skipped`` are logged): the
    step that broke training. A step's ``loss`` is computed before its update, so
    when the first non-finite loss (step k) follows a step that *applied* a
    non-finite gradient (``overflow`` 1, ``skipped`` 0 at step k-1), that earlier
    step is the one that destroyed the weights and is the one named; otherwise
    it is the first step of the failing streak (first non-finite loss, or first
    skipped step). The reason says both steps when they differ.

    The end of training is judged too (:meth:`_judge_end`, after the last step's
    window): a loss still non-finite there, however short the streak, or weights
    that are non-finite (the last update applied a non-finite gradient while its
    own loss was finite) mean the model left training broken. Patience exists to
    let a streak recover; at the end nothing is left to recover in, and evaluating
    such weights gives mAP 0.00, a wrong number averaged with the other seeds. A run
    that skipped every one of its steps (fewer than ``max_consecutive_skips``) diverged
    too: it trained nothing, and its row would otherwise be the initial weights'
    mAP under the label of a method that never ran.
    """

    def __init__(
        self,
        sink: Sink,
        patience: int = 10,
        max_consecutive_skips: int = 200,
        policy: str = "stop",
        check_every: int = 1,
    ) -> None:
        self.sink = sink
        #: judge the steps a window at a time, when their losses are read anyway (the trial passes
        #: ``log_every``): each step is still judged, in order, so ``diverged_step`` is exact; a
        #: ``stop`` takes effect at the end of the window, up to ``check_every - 1`` steps later
        self.check_every = max(1, int(check_every))
        self._pending: list[StepRecord] = []
        self.patience = int(patience)
        self.max_skips = int(max_consecutive_skips)
        self.policy = policy
        self.bad = 0
        self.skips = 0
        self.bad_since: int | None = None  # first non-finite loss of the current streak
        self.cause_step: int | None = None  # the applied non-finite update just before it
        self._applied_nonfinite: int | None = None  # last step whose non-finite gradient was applied
        self._last_applied_nonfinite: int | None = None  # the latest such step of the whole run
        self.last_finite_loss: float | None = None
        self.last_scale: float = float("nan")
        self.diverged: TrialDiverged | None = None

    def after_step(self, trainer, record: StepRecord) -> None:
        self._pending.append(record)
        self._check_scale(trainer, record.step)
        last = record.step >= trainer.iterations
        if record.step % self.check_every == 0 or last:
            self._judge_pending(raise_stop=True)
        if last:  # the final (possibly partial) window is judged above; now the end itself
            self._judge_end(trainer, record.step)

    def _check_scale(self, trainer, step: int) -> None:
        """A loss scale that fell below the smallest normal fp32 (halved step after step on
        non-finite gradients) can never recover and would divide by zero when unscaling: the
        trial diverged, whatever the policy (there is nothing left to train on), with the reason."""
        scale = trainer.scaler.current_scale()
        if scale >= SCALE_FLOOR:
            return
        self._judge_pending(raise_stop=True)  # an earlier streak, if any, is the first cause
        self._declare(
            step,
            f"loss scale collapsed to {scale:g} after step {step} (below {SCALE_FLOOR:g}, the "
            "smallest normal fp32): gradients were non-finite at every scale tried",
            raise_stop=True,
        )
        raise self.diverged

    def after_train(self, trainer) -> None:
        # steps left when another hook stopped training mid-window: recorded, nothing raised
        self._judge_pending(raise_stop=False)
        self._judge_all_skipped(trainer, raise_stop=False)

    def _judge_pending(self, raise_stop: bool) -> None:
        pending, self._pending = self._pending, []
        read_records(pending)
        for record in pending:
            self._judge(record, raise_stop)

    def _judge(self, record: StepRecord, raise_stop: bool) -> None:
        step = record.step
        if math.isfinite(record.loss):
            self.bad = 0
            self.bad_since = self.cause_step = None
            self.last_finite_loss = record.loss
            self.last_scale = record.result.scale
        else:
            if self.bad == 0:
                self.bad_since = step
                self.cause_step = self._applied_nonfinite if self._applied_nonfinite == step - 1 else None
            self.bad += 1
        applied = bool(record.result.overflow) and not bool(record.result.skipped)
        self._applied_nonfinite = step if applied else None
        if applied:
            self._last_applied_nonfinite = step
        self.skips = self.skips + 1 if record.result.skipped else 0
        reason = None
        first_bad = step
        if self.bad >= self.patience:
            first_bad = self.cause_step or self.bad_since or step
            reason = f"loss non-finite for {self.bad} consecutive steps from step {self.bad_since}"
            if self.cause_step is not None:
                reason = f"non-finite gradient applied at step {self.cause_step} (overflow, not skipped); " + reason
        elif self.skips >= self.max_skips:
            first_bad = step - self.skips + 1
            reason = f"{self.skips} consecutive steps skipped on overflow from step {first_bad}"
        if reason:
            self._declare(first_bad, reason, raise_stop)

    def _declare(self, step: int, reason: str, raise_stop: bool) -> None:
        """Record the first divergence (tags) and, for policy ``stop``, end the loop."""
        if self.diverged is not None:
            return
        self.diverged = TrialDiverged(step, self.last_finite_loss, self.last_scale, reason)
        self.sink.tags(
            {
                "lsbench.diverged_step": step,
                "lsbench.diverged_reason": reason,
                "lsbench.last_finite_loss": self.last_finite_loss,
                "lsbench.diverged_scale": self.last_scale,
            }
        )
        if self.policy == "stop" and raise_stop:
            raise self.diverged

    def _judge_end(self, trainer, step: int) -> None:
        """Training reached its last step: a trailing non-finite loss (any streak length) or
        non-finite weights are a divergence (class doc). ``diverged_step`` keeps the meaning of
        the streak rule; for weights broken by the last update(s), the latest step that applied
        a non-finite gradient (the final step if none was seen, e.g. a NaN from the optimizer)."""
        if self.diverged is not None:
            return
        if self.bad > 0:
            first_bad = self.cause_step or self.bad_since or step
            reason = (
                f"training ended with the loss non-finite for its last {self.bad} steps from step "
                f"{self.bad_since} (fewer than patience {self.patience})"
            )
            if self.cause_step is not None:
                reason = f"non-finite gradient applied at step {self.cause_step} (overflow, not skipped); " + reason
            self._declare(first_bad, reason, raise_stop=True)
        elif not _weights_finite(trainer.model):
            cause = self._last_applied_nonfinite or step
            reason = f"weights non-finite at the end of training (step {step})"
            if self._last_applied_nonfinite is not None:
                reason = f"non-finite gradient applied at step {cause} (overflow, not skipped); " + reason
            self._declare(cause, reason, raise_stop=True)
        else:
            self._judge_all_skipped(trainer, raise_stop=True)

    def _judge_all_skipped(self, trainer, raise_stop: bool) -> None:
        """A run that skipped every step it took (the trainer's counts: a resumed run's earlier steps
        too) trained nothing: its weights are the initial ones, whatever the label says (a scale past
        what the precision can carry overflows on every step). Shorter than ``max_consecutive_skips``
        it would otherwise end ``finished``; it diverged, from step 1, with the scale it kept."""
        st = trainer.state
        if self.diverged is not None or st.step == 0 or st.skipped_steps < st.step:
            return
        self._declare(
            1,
            f"every step skipped on overflow ({st.step} of {st.step}; no update was applied) at "
            f"loss scale {trainer.scaler.current_scale():g}",
            raise_stop,
        )


def _weights_finite(model: torch.nn.Module) -> bool:
    """Every floating parameter and buffer (BatchNorm statistics too) finite; one host read."""
    flags = [
        torch.isfinite(t).all() for t in (*model.parameters(), *model.buffers()) if t.is_floating_point() and t.numel()
    ]
    return bool(torch.stack(flags).all().item()) if flags else True


class EvalHook(Hook):
    """Evaluates every ``every`` iterations (not at the end: the trial does the final evaluation)."""

    def __init__(
        self,
        sink: Sink,
        evaluate: Callable[[], dict[str, float]],
        every: int | None,
        on_eval: Callable[[int, dict], None] | None = None,
    ) -> None:
        self.sink = sink
        self.evaluate = evaluate
        self.every = every
        self.on_eval = on_eval
        self.best_map = float("-inf")

    def run_eval(self, trainer) -> dict[str, float]:
        res = self.evaluate()
        step = trainer.state.step
        self.best_map = max(self.best_map, res.get("map", float("-inf")))
        self.sink.metrics([(k, float(v), step) for k, v in res.items() if k in ("map", "map_50")])
        self.sink.flush_when_due()
        if self.on_eval:
            self.on_eval(step, res)
        return res

    def after_step(self, trainer, record: StepRecord) -> None:
        if self.every and record.step % self.every == 0 and record.step < trainer.iterations:
            self.run_eval(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"best_map": self.best_map}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_map = state.get("best_map", float("-inf"))


def atomic_torch_save(obj: Any, path: Path) -> None:
    """Write to a temp file in the same folder, fsync, then rename: a kill never leaves half a checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class CheckpointHook(Hook):
    """Saves the full training state every ``every`` iterations (and when training stops early)."""

    def __init__(self, path: Path, every: int, state_fn: Callable[[], dict]) -> None:
        self.path = Path(path)
        self.every = max(1, int(every))
        self.state_fn = state_fn

    def after_step(self, trainer, record: StepRecord) -> None:
        if record.step % self.every == 0:
            atomic_torch_save(self.state_fn(), self.path)


class TelemetryHook(Hook):
    """Arms the underflow probe on logged steps; logs summaries and appends the per-layer history."""

    def __init__(self, sink: Sink, probe, history, every: int) -> None:
        self.sink = sink
        self.probe = probe
        self.history = history
        self.every = max(1, int(every))
        self.last_rates: dict = {}

    def before_step(self, trainer, step: int) -> None:
        if step % self.every == 0 or step == 1:
            self.probe.arm()

    def after_step(self, trainer, record: StepRecord) -> None:
        if not self.probe.armed:
            return
        self.probe.disarm()
        from ..precision.telemetry import summarize

        self.last_rates = self.probe.read()
        self.sink.metrics([(k, v, record.step) for k, v in summarize(self.last_rates).items()])
        self.history.append(record.step, self.last_rates, trainer.scaler.layer_table())

    def after_train(self, trainer) -> None:
        self.probe.remove()
