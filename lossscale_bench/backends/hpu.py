"""HPU (Intel Gaudi) backend, written against habana_frameworks.torch's documented API; not run here.

Lazy mode accumulates ops into a graph that ``htcore.mark_step()`` executes:
after ``backward()`` and after the optimizer step (Habana's published training
recipe). Mixed precision is ``torch.autocast("hpu", torch.bfloat16)``.
Habana's stack is installed from Habana's own index/container, not PyPI.
"""

from __future__ import annotations

import torch

from .base import Backend, BackendUnavailable

INSTALL_HINT = (
    "install Intel Gaudi software (habana-torch-plugin) from Habana's index or use their "
    "PyTorch container: https://docs.habana.ai/en/latest/Installation_Guide/"
)


class HPUBackend(Backend):
    name = "hpu"
    ray_resource = "HPU"

    def __init__(self) -> None:
        super().__init__()
        try:
            import habana_frameworks.torch.core as htcore
        except Exception as exc:  # noqa: BLE001
            raise BackendUnavailable(
                f"backend hpu: cannot import habana_frameworks.torch ({exc}); {INSTALL_HINT}"
            ) from None
        self._htcore = htcore
        self.device = torch.device("hpu")

    def after_backward(self) -> None:
        self._htcore.mark_step()

    def after_step(self) -> None:
        self._htcore.mark_step()

    def synchronize(self) -> None:
        import habana_frameworks.torch.hpu as hthpu

        hthpu.synchronize()

    def memory_stats(self) -> dict[str, float]:
        try:
            import habana_frameworks.torch.hpu as hthpu

            return {"hpu_max_allocated_mb": hthpu.max_memory_allocated() / 2**20}
        except Exception:  # noqa: BLE001
            return {}
