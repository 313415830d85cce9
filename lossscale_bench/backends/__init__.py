"""Backends by name; vendor packages are imported only when their backend is built."""

from __future__ import annotations

from ..core.registry import BACKEND_NAMES
from .base import Backend, BackendUnavailable

# Ray resource each backend's trial asks for (None: CPU only), known without importing vendors.
RAY_RESOURCE = {"cpu": None, "cuda": "GPU", "xla": "TPU", "hpu": "HPU", "auto": None}


def detect() -> str:
    """The best backend this worker has: cuda, then hpu, then xla, else cpu."""
    import importlib.util
    import os

    import torch

    if torch.cuda.is_available():
        return "cuda"
    if importlib.util.find_spec("habana_frameworks") is not None:
        return "hpu"
    if (os.environ.get("PJRT_DEVICE") or os.environ.get("TPU_NAME")) and importlib.util.find_spec("torch_xla"):
        return "xla"
    return "cpu"


def get_backend(name: str, *, threads: int | None = None, **options) -> Backend:
    if name == "auto":
        name = detect()
    if name == "cpu":
        from .cpu import CPUBackend

        return CPUBackend(threads=threads)
    if name == "cuda":
        from .cuda import CUDABackend

        return CUDABackend(**options)
    if name == "xla":
        from .xla import XLABackend

        return XLABackend()
    if name == "hpu":
        from .hpu import HPUBackend

        return HPUBackend()
    raise ValueError(f"unknown backend {name!r}; allowed: {', '.join(BACKEND_NAMES)}")


def ray_resources(name: str, devices: int = 1, cpus: float = 1.0) -> dict[str, float]:
    """Resources for one trial of ``name`` without building the backend (the driver may lack the device)."""
    res: dict[str, float] = {"CPU": float(cpus)}
    if RAY_RESOURCE.get(name):
        res[RAY_RESOURCE[name]] = float(devices)
    return res


__all__ = ["Backend", "BackendUnavailable", "get_backend", "ray_resources", "detect", "RAY_RESOURCE"]
