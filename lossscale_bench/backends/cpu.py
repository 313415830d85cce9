"""CPU backend: the test and demo machine. fp16 autocast works but is ~45x slower than fp32,
so CPU studies use ``fp16-emulated`` (see precision.py)."""

from __future__ import annotations

import os

import torch

from .base import Backend


class CPUBackend(Backend):
    name = "cpu"
    ray_resource = None

    def __init__(self, threads: int | None = None) -> None:
        super().__init__()
        self.device = torch.device("cpu")
        if threads:
            # Each Ray trial gets its CPU share; without this two concurrent
            # trials each start one thread per core and thrash (FIELD-NOTES).
            torch.set_num_threads(max(1, int(threads)))

    def memory_stats(self) -> dict[str, float]:
        try:
            import resource

            return {"host_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
        except Exception:  # noqa: BLE001 - not on every platform
            return {}

    def describe(self) -> str:
        return f"cpu ({torch.get_num_threads()} threads, {os.cpu_count()} cores)"
