"""CUDA backend: real fp16 (``mixed16``) and bf16 autocast, cudnn.benchmark, channels_last, fused SGD,
optional ``torch.compile``.

Written against PyTorch's documented CUDA APIs; **not yet run on a GPU** in this project
(README's support table). What each choice is for:

* ``channels_last`` (default on): cuDNN's tensor-core convolutions work in NHWC; with NCHW
  weights every fp16 convolution pays for layout transposes (PyTorch's "channels last"
  tutorial). Values differ from NCHW only by float reordering.
* ``fused=True`` SGD (``optimizer_options``): one kernel for the whole update instead of one
  per parameter and operation (``torch.optim.SGD``'s documented ``fused`` flag, CUDA tensors).
* ``compile`` (default off; study ``resources.compile``): ``nn.Module.compile()`` on the
  backbone and the heads, in place, so parameter names, state dicts, checkpoints and the
  per-layer hooks of adaptive scaling and telemetry keep their names. The matching, the loss
  and torchvision's transform stay eager (lists of images, data-dependent work). Imported
  lazily by torch itself on first call; not in the trial id.
"""

from __future__ import annotations

import os

import torch

from .base import Backend, BackendUnavailable

#: submodules of a torchvision SSD that ``compile`` compiles (the dense compute)
COMPILED_PARTS = ("backbone", "head")


def compile_parts(model: torch.nn.Module, parts=COMPILED_PARTS, **compile_kwargs) -> list[str]:
    """``nn.Module.compile`` each of ``parts`` that ``model`` has (in place); the names compiled.
    Split out so the selection is testable without a GPU."""
    done = []
    for name in parts:
        sub = getattr(model, name, None)
        if isinstance(sub, torch.nn.Module):
            sub.compile(**compile_kwargs)
            done.append(name)
    return done


class CUDABackend(Backend):
    name = "cuda"
    ray_resource = "GPU"

    def __init__(
        self, channels_last: bool = True, benchmark: bool = True, compile: bool = False, fused_optimizer: bool = True
    ) -> None:
        super().__init__()
        if not torch.cuda.is_available():
            raise BackendUnavailable(
                "backend cuda: no CUDA device is visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
            )
        # Ray sets CUDA_VISIBLE_DEVICES per trial, so device 0 is this trial's GPU.
        self.device = torch.device("cuda", 0)
        torch.cuda.set_device(self.device)
        torch.backends.cudnn.benchmark = benchmark
        self.channels_last = bool(channels_last)
        self.compile = bool(compile)
        self.fused_optimizer = bool(fused_optimizer)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if self.compile:
            compile_parts(model)
        return model

    def optimizer_options(self) -> dict:
        return {"fused": True} if self.fused_optimizer else {}

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
        extras = [
            x
            for x, on in (
                ("channels_last", self.channels_last),
                ("compiled", self.compile),
                ("fused SGD", self.fused_optimizer),
            )
            if on
        ]
        return f"cuda ({torch.cuda.get_device_name(self.device)}; {', '.join(extras) or 'plain'})"
