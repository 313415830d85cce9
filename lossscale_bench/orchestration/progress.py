"""The console side of a study: one line per trial event, a running count and an ETA.

Separate from the MLflow side (``funnel``, ``outcomes``) because it writes
only to a terminal and its format is for people: mAP in percent with two
decimals as in the report (MLflow keeps the fractions). It holds no stream
object by default, so a Tune callback holding it can be pickled.
"""

from __future__ import annotations

import sys
import time


def _pct(fraction) -> str:
    """An mAP fraction as the report shows it: ``0.5120`` -> ``51.20%`` (``–`` when there is none)."""
    return "–" if fraction is None else f"{float(fraction) * 100:.2f}%"


class Progress:
    """One line per trial event, plus a running count and ETA (``quiet`` prints only the end)."""

    def __init__(self, total: int, already: int, concurrency: int, quiet: bool, stream=None) -> None:
        self.total, self.already, self.concurrency, self.quiet = total, already, max(1, concurrency), quiet
        self._stream = stream  # None: sys.stdout at print time (Tune pickles callbacks; keep streams out)
        self.started: dict[str, float] = {}
        self.durations: list[float] = []
        self.status: dict[str, str] = {}
        self.last_step: dict[str, int] = {}

    def line(self, msg: str) -> None:
        if not self.quiet:
            self.notice(msg)

    def notice(self, msg: str) -> None:
        """A line printed even with ``quiet``: what changed in the stored results (a label renamed, the
        study file edited under the same name) is not progress, and a quiet run must not hide it."""
        print(msg, file=self._stream or sys.stdout, flush=True)

    def _summary(self) -> str:
        vals = list(self.status.values())
        done = self.already + sum(v in ("finished", "diverged", "failed") for v in vals)
        running = sum(v == "running" for v in vals)
        eta = ""
        remaining = self.total - done
        if self.durations and remaining:
            mean = sum(self.durations) / len(self.durations)
            eta = f", ETA ~{mean * remaining / self.concurrency / 60:.1f} min"
        return (
            f"[{done}/{self.total} done, {running} running, {vals.count('failed')} failed, "
            f"{vals.count('diverged')} diverged{eta}]"
        )

    def start(self, tid: str, label: str) -> None:
        self.started[tid] = time.time()
        self.status[tid] = "running"
        self.line(f"{self._summary()} start   {label} ({tid})")

    def step(self, tid: str, label: str, step: int, loss: float | None, iterations: int) -> None:
        """A per-trial progress line about every tenth of its iterations."""
        every = max(1, iterations // 10)
        last = self.last_step.get(tid, 0)
        if loss is not None and step // every > last // every:
            self.line(f"    {label} ({tid}) step {step}/{iterations} loss {loss:.4g}")
        self.last_step[tid] = step

    def end(self, tid: str, label: str, outcome: dict) -> None:
        self.status[tid] = outcome.get("status", "failed")
        if tid in self.started:
            self.durations.append(time.time() - self.started[tid])
        extra = ""
        if outcome.get("final_map") is not None:
            # percent with two decimals, as in the report (MLflow keeps the fractions)
            extra = f" mAP {_pct(outcome['final_map'])} mAP@0.5 {_pct(outcome.get('final_map_50'))}"
        if outcome.get("diverged_step") is not None:
            extra += f" diverged at step {outcome['diverged_step']}"
        if outcome.get("error"):
            extra += f" error: {outcome['error'][:200]}"
        self.line(f"{self._summary()} {self.status[tid]:8s} {label} ({tid}){extra}")
