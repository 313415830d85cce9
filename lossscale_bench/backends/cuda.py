"""CUDA backend: real fp16 (``mixed16``) and bf16 autocast, cudnn.benchmark, optional channels_last."""

from __future__ import annotations

import os

import torch

from .base import Backend, BackendUnavailable


class CUDABackend(Backend):
    name = "cuda"
    ray_resource = "GPU"

    def __init__(self, channels_last: bool = False, benchmark: bool = True) -> None:
        super().__init__()
        if not torch.cuda.is_available():
            raise BackendUnavailable("backend cuda: no CUDA device is visible "
                                     f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        # Ray sets CUDA_VISIBLE_DEVICES per trial, so device 0 is this trial's GPU.
        self.device = torch.device("cuda", 0)
        torch.cuda.set_device(self.device)
        torch.backends.cudnn.benchmark = benchmark
        self.channels_last = channels_last

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def memory_stats(self) -> dict[str, float]:
        return {
            "gpu_max_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
            "gpu_max_reserved_mb": torch.cuda.max_memory_reserved(self.device) / 2**20,
        }

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def describe(self) -> str:
        return f"cuda ({torch.cuda.get_device_name(self.device)})"
