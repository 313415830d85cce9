"""SHA-256 of each trial's final weights, for checking that a change to the code changed no result.

Runs the trials of a study in this process (no Ray, no MLflow), each for ``--iterations`` steps with one
thread, and prints one line per trial: the row's label, the trial id and the SHA-256 of the model's
``state_dict`` at the end (names and fp32 bytes, in name order). Run it on two checkouts and compare::

    PYTHONPATH=. python tools/weights_digest.py lossscale_bench/studies/smoke.yaml --iterations 60 --seeds 0

Same lines: the same weights, bit for bit, row by row. ``--device-path`` runs the trials with the CPU's host
shortcuts switched off (``lossscale_bench.core.host_path.device_path``): the code path an accelerator takes,
which a change to the scalers' device code must also leave bit for bit unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
import tempfile
from pathlib import Path


def _memory_sink():
    try:
        from lossscale_bench.engine.sink import MemorySink
    except ImportError:  # checkouts from before the sink moved into engine/
        from lossscale_bench.sink import MemorySink
    return MemorySink()


def digest(model) -> str:
    """SHA-256 over the model's state, parameter and buffer names with their values as fp32 bytes."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path)
    ap.add_argument("--iterations", type=int, default=60, help="steps per trial (default 60)")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="only these seeds (default: the study's)")
    ap.add_argument("--rows", type=int, nargs="*", default=None, help="only these scaling entries (0-based)")
    ap.add_argument(
        "--device-path", action="store_true", help="the accelerator's code path: the CPU's host shortcuts off"
    )
    args = ap.parse_args(argv)

    from lossscale_bench.core.host_path import device_path
    from lossscale_bench.engine import loop
    from lossscale_bench.study import load_study_text
    from lossscale_bench.trial import run_trial

    study = load_study_text(args.study.read_text(), str(args.study))
    finals: list[str] = []
    real_run = loop.Trainer.run

    def run(self):
        state = real_run(self)
        finals.append(digest(self.model))
        return state

    loop.Trainer.run = run
    with tempfile.TemporaryDirectory() as tmp, device_path() if args.device_path else contextlib.nullcontext():
        for cfg in study.trials():
            if (args.seeds is not None and cfg.seed not in args.seeds) or (
                args.rows is not None and cfg.row not in args.rows
            ):
                continue
            cfg = cfg.model_copy(update={"schedule": {**cfg.schedule, "iterations": args.iterations}})
            finals.clear()
            out = run_trial(cfg, sink=_memory_sink(), trial_dir=Path(tmp) / cfg.trial_id, threads=1)
            sha = finals[0] if finals else f"no final weights ({out.status}: {out.error})"
            print(f"{cfg.label} | {cfg.trial_id} | {sha}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
