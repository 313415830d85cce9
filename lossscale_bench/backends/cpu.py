"""CPU backend: the test and demo machine. fp16 autocast works but is ~45x slower than fp32,
so CPU studies use ``fp16-emulated`` (see precision/runtime.py)."""

from __future__ import annotations

import os

import torch

from .base import Backend
from .host_memory import keep_freed_memory


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
        # side (docs/records/index.md). Values differ from NCHW only by float reordering.
        self.channels_last = bool(channels_last)
        # glibc otherwise hands a step's freed memory back to the kernel and the next step faults it in
        # again: 4-15 ms of a 35-60 ms ssd_tiny step (host_memory's doc); the same values
        self.keeps_freed_memory = keep_freed_memory()

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

            use = resource.getrusage(resource.RUSAGE_SELF)
            # the process's minor page faults so far (imports and build included), and whether
            # host_memory's setting was in force: a trial's own evidence that its steps stopped faulting
            return {
                "host_max_rss_mb": use.ru_maxrss / 1024.0,
                "host_minor_faults": float(use.ru_minflt),
                "host_freed_memory_kept": float(self.keeps_freed_memory),
            }
        except Exception:  # noqa: BLE001 - not on every platform
            return {}

    def describe(self) -> str:
        from ..core.portable import describe

        return f"cpu ({torch.get_num_threads()} threads, {os.cpu_count()} cores, {describe()})"
