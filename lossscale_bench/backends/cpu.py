"""CPU backend: the test and demo machine. fp16 autocast works but is ~45x slower than fp32,
so CPU studies use ``fp16-emulated`` (see precision.py)."""

from __future__ import annotations

import os

import torch

from .base import Backend


class CPUBackend(Backend):
    name = "cpu"
    ray_resource = None

    def __init__(self, threads: int | None = None, channels_last: bool = True) -> None:
        super().__init__()
        self.device = torch.device("cpu")
        if threads:
            # Each Ray trial gets its CPU share; without this two concurrent
            # trials each start one thread per core and thrash (FIELD-NOTES).
            torch.set_num_threads(max(1, int(threads)))
        # channels_last: torch's CPU MaxPool2d on NCHW runs ~10x slower than on NHWC
        # (11 ms vs 1 ms for 8x16x128x128, one thread), and oneDNN's convolutions prefer
        # NHWC too: an ssd_tiny training step took 59 ms in NCHW and 38 ms in NHWC, side by
        # side (docs/benchmarks.md). Values differ from NCHW only by float reordering.
        self.channels_last = bool(channels_last)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    def optimizer_options(self) -> dict:
        """foreach SGD: one multi-tensor call instead of a Python loop over parameters (torch picks
        it by default on CUDA only). The same update bit for bit (tests/backends)."""
        return {"foreach": True}

    def memory_stats(self) -> dict[str, float]:
        try:
            import resource

            return {"host_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
        except Exception:  # noqa: BLE001 - not on every platform
            return {}

    def describe(self) -> str:
        from ..portable import describe

        return f"cpu ({torch.get_num_threads()} threads, {os.cpu_count()} cores, {describe()})"
