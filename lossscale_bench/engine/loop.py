"""One training step, and the loop that repeats it.

A step is: autocast forward -> ``scaler.scale(loss).backward()`` -> backend
hook -> optional unscale for clipping (``Precision.unscale_grads``, which also rounds
where the precision stores gradients after unscaling) -> ``scaler.step`` (backend's
optimizer step; what happened is ``scaler.last_step``) -> ``scaler.update`` -> lr
schedule: ``torch.amp.GradScaler``'s interface, the one a user's loop uses too. The
loop knows no scaler type, no precision's specifics, no device type and no tracking
system: those live behind ``LossScaler``, ``Precision``, ``Backend`` and the hooks.

Host synchronisation. With ``sync_every`` N > 1 (the trial passes its
``log_every``) a step does not wait for the device: its loss stays a device
tensor in the :class:`StepRecord` until a hook reads it, and the hooks that
read losses (``MetricsHook``, ``DivergenceHook``) read a whole window with one
transfer (:func:`read_records`) every N steps; the backend synchronises only on
those steps and ``images_per_sec`` is the window's throughput. Reads that
remain per step, all in the scalers, because their decisions are made on the
host: the overflow verdict (``LossScaler.step`` reads the fused non-finite
flag: skip or step, and the next scale, for every method; for ``none`` it only
feeds the ``overflow`` metric and could be deferred too), ``amax``'s new loss
scale (a float for the next ``scale()``), and the layer-wise dynamic scaler's per-point
flags. The SSD loss itself reads nothing on an accelerator
(``models/multibox_loss.py``); torchvision's reads four times per image (the
degenerate-box check, two boolean-mask writes in ``SSDMatcher``, ``torch.where``)
and three times per batch (boolean indexing in the hard-negative mining). N = 1 is the old
behaviour: every step synchronised and read.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends.base import Backend
from ..precision import Precision
from ..scaling.base import LossScaler, StepResult

#: torch's warning when the first optimizer step was skipped by the loss scaler (see Trainer.train_step)
_SKIPPED_FIRST_STEP = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"


class _Window:
    """Steps between two device synchronisations: their images and the wall time they took."""

    __slots__ = ("start", "images", "seconds")

    def __init__(self, start: float) -> None:
        self.start = start
        self.images = 0
        self.seconds: float | None = None  # set when the window closes (the device was waited for)


class StepRecord:
    """One step as the hooks see it.

    ``loss`` (unscaled total, may be nan/inf) and ``parts`` are read from the device on first
    access; :func:`read_records` reads many records with one transfer. ``images_per_sec`` is
    the throughput of the window of steps between two device synchronisations this step
    belongs to (one step when the trainer synchronises every step); while that window is
    open, this step's own host-side rate.
    """

    __slots__ = ("step", "result", "lr", "seconds", "part_names", "_values", "_floats", "_images", "_window")

    def __init__(
        self,
        step: int,
        values: torch.Tensor,
        part_names: list[str],
        result: StepResult,
        lr: float,
        images: int,
        seconds: float,
        window: _Window | None = None,
    ) -> None:
        self.step = step  # iterations completed after this one (1-based)
        self.result = result
        self.lr = lr
        self.seconds = seconds
        self.part_names = list(part_names)
        self._values = values  # [1 + len(parts)] on the device: total loss, then the parts
        self._floats: list[float] | None = None
        self._images = images
        self._window = window

    @property
    def loss(self) -> float:
        read_records([self])
        return self._floats[0]  # type: ignore[index]

    @property
    def parts(self) -> dict[str, float]:
        read_records([self])
        return dict(zip(self.part_names, self._floats[1:]))  # type: ignore[index]

    @property
    def is_read(self) -> bool:
        return self._floats is not None

    @property
    def images_per_sec(self) -> float:
        w = self._window
        if w is not None and w.seconds is not None:
            return w.images / w.seconds if w.seconds > 0 else math.inf
        return self._images / self.seconds if self.seconds > 0 else math.inf


def read_records(records: Iterable[StepRecord]) -> None:
    """Fetch the losses of every record not yet read in one device-to-host transfer."""
    todo = [r for r in records if r._floats is None]
    if not todo:
        return
    if len(todo) == 1:
        todo[0]._floats = todo[0]._values.tolist()
    else:
        for r, row in zip(todo, torch.stack([r._values for r in todo]).tolist()):
            r._floats = row
    for r in todo:
        r._values = None  # type: ignore[assignment]  # free the device tensor


@dataclass
class TrainState:
    step: int = 0
    skipped_steps: int = 0
    overflow_steps: int = 0
    images_seen: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class StopTraining(Exception):
    """Raised by a hook to end the loop early (reason in ``args``)."""


class Trainer:
    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        scaler: LossScaler,
        backend: Backend,
        precision: Precision,
        iterations: int,
        batches: Iterable = (),
        hooks=(),
        grad_clip: float | None = None,
        bias_grad_factor: float = 1.0,
        state: TrainState | None = None,
        grad_sync=None,
        sync_every: int = 1,
    ):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.backend = backend
        self.precision = precision
        self.batches: Iterator = iter(batches)
        self.iterations = int(iterations)
        self.hooks = list(hooks)
        self.grad_clip = grad_clip
        self.bias_grad_factor = float(bias_grad_factor)
        self.state = state or TrainState()
        # Data parallelism without DDP: every replica unscales its own gradients (each
        # scaler knows the scales its gradients carry, per layer for adaptive), then
        # ``grad_sync(params)`` averages the true gradients across replicas, and
        # ``grad_sync.mean(t)`` (if it has one) the step's loss values, so that every replica
        # logs the same loss and takes the same divergence decisions. The object comes from
        # the launcher (``replica_sync.GradSync``); the loop knows only this interface.
        self.grad_sync = grad_sync
        self._bias_params = [p for n, p in model.named_parameters() if n.endswith(".bias") and p.requires_grad]
        #: wait for the device (and read losses eagerly) every this many steps; module doc
        self.sync_every = max(1, int(sync_every))
        self._window: _Window | None = None

    # -- one step ---------------------------------------------------------------
    def train_step(self, images: list[torch.Tensor], targets: list[dict]) -> StepRecord:
        t0 = time.perf_counter()
        if self._window is None:
            self._window = _Window(t0)
        images, targets = self.backend.to_device(images, targets)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.backend.autocast(self.precision.autocast_dtype):
            parts = self.model(images, targets)
            loss = sum(parts.values())
        self.scaler.scale(loss.float()).backward()
        self.backend.after_backward()
        # clipping, the bias factor and the replicas' average act on true gradient values, so these unscale
        # first; the precision unscales (and rounds) every step where it stores gradients after unscaling
        needed = bool(self.grad_clip) or self.bias_grad_factor != 1.0 or self.grad_sync is not None
        if self.precision.unscale_grads(self.scaler, self.optimizer, needed=needed):
            if self.grad_sync is not None:
                self.grad_sync([p for g in self.optimizer.param_groups for p in g["params"]])
            if self.bias_grad_factor != 1.0:
                for p in self._bias_params:
                    if p.grad is not None:
                        p.grad.mul_(self.bias_grad_factor)
            if self.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.scaler.step(self.optimizer, step_fn=self.backend.optimizer_step)
        result = self.scaler.last_step
        self.scaler.update()
        with warnings.catch_warnings():
            # the schedule counts iterations, skipped steps included (as with torch's GradScaler), so
            # a skipped first step makes torch warn of a scheduler stepped before the optimizer: not a bug
            warnings.filterwarnings("ignore", message=_SKIPPED_FIRST_STEP, category=UserWarning)
            self.scheduler.step()
        self.backend.after_step()
        vals = torch.stack([loss.detach().float()] + [v.detach().float() for v in parts.values()])
        if self.grad_sync is not None and hasattr(self.grad_sync, "mean"):
            # replicas log the mean loss and take the same divergence decisions
            vals = self.grad_sync.mean(vals)
        st = self.state
        st.step += 1
        st.images_seen += len(images)
        st.skipped_steps += int(result.skipped)
        st.overflow_steps += int(result.overflow)
        window = self._window
        window.images += len(images)
        closes = self.sync_every == 1 or st.step % self.sync_every == 0 or st.step >= self.iterations
        if closes:
            self.backend.synchronize()
        now = time.perf_counter()
        record = StepRecord(
            step=st.step,
            values=vals,
            part_names=list(parts),
            result=result,
            lr=lr,
            images=len(images),
            seconds=now - t0,
            window=window,
        )
        if closes:
            window.seconds = now - window.start
            self._window = None
        if self.sync_every == 1:
            read_records([record])
        return record

    # -- the loop ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs of the loop: weights, optimizer, lr schedule, scaler (per-layer
        state too), the precision's random streams, the counters, and each hook's own state (by hook class name)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "precision": self.precision.state_dict(),
            "step": self.state.step,
            "skipped_steps": self.state.skipped_steps,
            "overflow_steps": self.state.overflow_steps,
            "images_seen": self.state.images_seen,
            "hooks": {type(h).__name__: st for h in self.hooks if (st := h.state_dict())},
        }

    def load_state_dict(self, ck: dict[str, Any]) -> None:
        self.model.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.scheduler.load_state_dict(ck["scheduler"])
        self.scaler.load_state_dict(ck["scaler"])
        self.precision.load_state_dict(ck.get("precision", {}))
        self.state.step, self.state.skipped_steps, self.state.overflow_steps, self.state.images_seen = (
            ck["step"],
            ck["skipped_steps"],
            ck["overflow_steps"],
            ck["images_seen"],
        )
        for h in self.hooks:
            h.load_state_dict(ck.get("hooks", {}).get(type(h).__name__, {}))

    def run(self) -> TrainState:
        for h in self.hooks:
            h.before_train(self)
        reason = None
        try:
            while self.state.step < self.iterations:
                _, images, targets = next(self.batches)
                for h in self.hooks:
                    h.before_step(self, self.state.step + 1)
                record = self.train_step(images, targets)
                for h in self.hooks:
                    h.after_step(self, record)
        except StopTraining as stop:
            reason = stop
        for h in self.hooks:
            h.after_train(self)
        if reason is not None:
            raise reason
        return self.state
