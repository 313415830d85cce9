"""A trial's checkpoint: what it holds beyond the trainer's state, how it is read and resumed.

The trainer and its hooks say what they carry (``Trainer.state_dict``); the trial adds its
id (a checkpoint of another trial is refused, not silently loaded), the RNG states (so the
data stream and augmentations continue as they would have) and, for old checkpoints, the
best mAP at the top level. Loading uses ``weights_only=True``: no code runs from a file.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be read (truncated, corrupt, foreign)."""


def rng_state() -> dict[str, Any]:
    st = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [st[0], st[1].tolist(), int(st[2]), int(st[3]), float(st[4])],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(tuple(state["python"]) if not isinstance(state["python"], tuple) else state["python"])
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load with ``weights_only=True`` (no code execution from a checkpoint file)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated zip, pickle error, foreign file
        # the advice before the detail: progress lines cut an error at 200 characters
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise CheckpointError(
            f"checkpoint cannot be read; delete it to restart this trial from scratch: {path} "
            f"({type(exc).__name__}: {detail})"
        ) from None


def capture(trainer, trial_id: str, best_map: float) -> dict[str, Any]:
    """The checkpoint of ``trainer`` now (the keys older checkpoints had stay at the top level)."""
    return {"trial_id": trial_id, **trainer.state_dict(), "best_map": best_map, "rng": rng_state()}


def resume(trainer, path: Path, trial_id: str) -> dict[str, Any] | None:
    """Load ``path`` into ``trainer`` if it exists; returns the checkpoint (None: fresh start)."""
    if not path.exists():
        return None
    ck = load_checkpoint(path)
    if ck.get("trial_id") != trial_id:
        raise CheckpointError(f"checkpoint {path} belongs to trial {ck.get('trial_id')}, not {trial_id}")
    if "hooks" not in ck:  # written before hooks had state: the best mAP sat at the top level
        ck = {**ck, "hooks": {"EvalHook": {"best_map": ck.get("best_map", float("-inf"))}}}
    trainer.load_state_dict(ck)
    set_rng_state(ck["rng"])
    return ck


def atomic_done(ckpt_path: Path) -> None:
    """A finished trial needs no checkpoint to resume from; drop it to save disk."""
    try:
        ckpt_path.unlink()
    except FileNotFoundError:
        pass
