"""Adaptive layer-wise loss scaling (Zhao et al. 2019), for unmodified PyTorch models.

The algorithm is ``docs/development/adaptive-algorithm.md`` (method ``approx_range``, the authors'
default); why it is built the way it is (a per-instance ``forward`` patch with a custom
autograd Function rather than backward hooks, a walk of the loss's graph to know which
scale each gradient carries, merges at branch points, unscaling per scale group), its
deviations from the Chainer reference and its limits are in ``docs/development/adaptive-design.md``.
Usage is GradScaler's (docs/guide/own-loop.md)::

    with create_scaler("adaptive", model, precision=precision) as scaler:   # after precision.prepare(model)
        scaler.scale(loss).backward()
        scaler.step(optimizer)                    # the optimizer's result; scaler.last_step: StepResult
        scaler.update()
        ...
    # the block's end calls scaler.remove(): the model is restored exactly

Not supported (docs/development/adaptive-design.md "Limits"): double backward, reentrant checkpointing,
``torch.compile`` of the patched modules, two separately scaled losses in one backward,
``torch.autograd.grad`` with ``inputs``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..core.host_path import on_host
from ..precision.formats import FP16, FloatFormat
from .adaptive_rule import (
    bound_from_parts,
    bound_scale_host,
    bound_scale_tensor,
    headroom,
    layer_cap,
    output_scale_tensor,
    pass_headroom,
    unbounded_scale_host,
    unbounded_scale_tensor,
    underflow_k,
)
from .per_layer import PerLayerLossScaler
from .per_layer.functions import LayerInfo, PointInfo, point_hook
from .per_layer.iteration import Iteration

__all__ = ["AdaptiveLossScaler", "find_output_points", "UPDATE_COUNTS"]

#: what ``update_every`` counts: optimizer steps (ours) or each layer's backward calls (the reference)
UPDATE_COUNTS = ("steps", "calls")

_F32 = torch.float32


def find_output_points(model: nn.Module) -> list[tuple[str, nn.Module, str, bool]]:
    """The reference's ``ada_loss_cast`` points in ``model``: (name, module, kind, lognormal).

    * every conv of a torchvision SSD head (``SSDClassificationHead``/``SSDRegressionHead``
      ``module_list``): the multibox outputs the authors' ``Multibox.forward`` casts with
      ``ada_loss_cast`` (lognormal for the class scores, ``mb_conf``);
    * any module with an ``ada_output_point`` attribute (its kind) and optional ``ada_lognormal``:
      ``models/ssd.py`` marks the L2Norm input of the VGG16 SSDs this way (``SSD.forward``
      there casts ``ys[0]`` before ``Normalize``).
    """
    points = []
    for name, mod in model.named_modules():
        kind = getattr(mod, "ada_output_point", None)
        if isinstance(kind, str):
            points.append((name, mod, kind, bool(getattr(mod, "ada_lognormal", False))))
    try:
        from torchvision.models.detection.ssd import SSDClassificationHead, SSDRegressionHead
    except ImportError:  # pragma: no cover - torchvision is a dependency
        return points
    for name, mod in model.named_modules():
        if isinstance(mod, (SSDClassificationHead, SSDRegressionHead)):
            is_cls = isinstance(mod, SSDClassificationHead)
            for i, conv in enumerate(mod.module_list):
                points.append(
                    (f"{name}.module_list.{i}/output", conv, "class_output" if is_cls else "box_output", is_cls)
                )
    return points


def _world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


class AdaptiveLossScaler(PerLayerLossScaler):
    """Adaptive layer-wise loss scaling on an unmodified model (see module doc).

    Options as in docs/development/adaptive-algorithm.md. Keyword-only extras: ``sync_scales`` (all-reduce MIN
    of recomputed unbounded scales when distributed and ``update_every > 1``),
    ``unscale_in_backward`` (None: only for a model wrapped in DDP), ``scale_fn``
    (test hook: ``fn(layer_name, grad, weight, prev_scale) -> scale`` replaces
    steps 1-9), ``layer_types`` (a subset of Conv2d/Linear to scale), ``grad_format`` (the
    gradients' format, :mod:`lossscale_bench.precision.formats`; fp16 by default, E5M2 under
    ``fp8-emulated``: ``u_min``/``u_max`` of steps 5-6 and of branch merges come from it, as the
    reference's ``get_range(dtype)``), ``output_scaling`` (add the reference's later head-output and
    L2Norm-input scaling points; module doc), ``update_count`` (``"steps"``: ``update_every`` counts
    optimizer steps; ``"calls"``: each layer's backward calls, as the reference).
    """

    method = "adaptive"
    metric_prefix = "ada_"

    def __init__(
        self,
        model: nn.Module,
        update_every: int = 1,
        init_scale: float = 1.0,
        n_uf_threshold: float = 1e-3,
        scale_upper_bound: float = 16.0,
        accum_upper_bound: float = 1024.0,
        power_of_two: bool = True,
        *,
        sync_scales: bool = True,
        unscale_in_backward: bool | None = None,
        scale_fn: Callable[[str, torch.Tensor, torch.Tensor, torch.Tensor], Any] | None = None,
        layer_types: tuple[type, ...] = (nn.Conv2d, nn.Linear),
        grad_format: FloatFormat = FP16,
        output_scaling: bool = False,
        update_count: str = "steps",
    ) -> None:
        if update_count not in UPDATE_COUNTS:
            raise ValueError(f"update_count must be one of {', '.join(UPDATE_COUNTS)}, got {update_count!r}")
        if model is None:
            raise ValueError("adaptive loss scaling needs the model")
        if int(update_every) != update_every or update_every < 1:
            raise ValueError(f"update_every must be a positive integer, got {update_every}")
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        if not (scale_upper_bound > 0 and accum_upper_bound > 0):
            raise ValueError("scale_upper_bound and accum_upper_bound must be > 0")
        underflow_k(n_uf_threshold)  # validates
        super().__init__(
            model,
            init_scale=init_scale,
            grad_format=grad_format,
            unscale_in_backward=unscale_in_backward,
            layer_types=layer_types,
        )
        self.update_every = int(update_every)
        self.update_count = update_count
        self.output_scaling = bool(output_scaling)
        self.n_uf_threshold = float(n_uf_threshold)
        self.scale_upper_bound = float(scale_upper_bound)
        self.accum_upper_bound = float(accum_upper_bound)
        self.power_of_two = bool(power_of_two)
        self.sync_scales = bool(sync_scales)
        self.scale_fn = scale_fn
        #: output scaling points' forward hooks (``output_scaling``)
        self._point_handles: list[Any] = []
        if self.output_scaling:
            self._attach_output_points(self._model)
        self._recomputed = False
        #: number of statistics computations (steps 1-6) since construction
        self.stat_computations = 0
        #: id(layer info) -> (its unbounded scale, that scale's cap, adaptive_rule.layer_cap)
        self._caps: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _attach_output_points(self, model: nn.Module) -> None:
        """The reference's later scaling points (head outputs, L2Norm input), as forward hooks."""
        for name, mod, kind, lognormal in find_output_points(model):
            info = PointInfo(name, kind, lognormal)
            self._output_points.append(info)
            self._by_name[info.name] = info
            self._point_handles.append(mod.register_forward_hook(point_hook(info)))
        if not self._output_points:
            warnings.warn("output_scaling: the model has no SSD head or marked module; nothing added", stacklevel=3)

    # -- the loop's interface ------------------------------------------------
    def _iteration_recomputes(self) -> bool:
        """Every ``update_every``-th step (``update_count: steps``; with ``calls`` each layer counts)."""
        recompute = self._iter % self.update_every == 0
        self._recomputed |= recompute and self.update_count == "steps"
        return recompute

    def update_scale(self) -> None:
        if self._recomputed and self.sync_scales and self.update_every > 1 and _world_size() > 1:
            self.agree_scales()
        self._recomputed = False
        super().update_scale()

    # -- the rule --------------------------------------------------------------
    def layer_factor(
        self, it: Iteration, layer: LayerInfo, grad: torch.Tensor, weight: torch.Tensor | None, incoming: torch.Tensor
    ) -> torch.Tensor:
        """The adaptive rule's layer scale (steps 1-9 of docs/development/adaptive-algorithm.md), bounded against
        the ``incoming`` scale; statistics recomputed when due, else the layer's last ones reused."""
        info, g, w, prev = layer, grad, weight, incoming
        if self.scale_fn is not None:
            s = self.scale_fn(info.name, g, w, prev)
            return torch.as_tensor(s, dtype=_F32, device=g.device).reshape(())
        if self.update_count == "calls":  # the reference: each layer's own counter of backward calls
            recompute = info.calls % self.update_every == 0
            info.calls += 1
            self._recomputed |= recompute
        else:
            recompute = it.recompute
        unb = info.last_unbounded
        # on the CPU the rule's scalar steps run on the host (adaptive_rule.unbounded_scale_host: the same
        # values, without ~20 dispatches of 0-d tensor ops a layer); elsewhere they stay on the device
        host = on_host(g, w)
        u = None  # the unbounded scale as a float, where the host computed it
        if recompute or unb is None:
            if getattr(info, "is_point", False):
                unb = output_scale_tensor(
                    g,
                    lognormal=info.lognormal,
                    n_uf_threshold=self.n_uf_threshold,
                    u_min=self.grad_format.u_min,
                    u_max=self.grad_format.u_max,
                )
            elif host:
                u = unbounded_scale_host(
                    g,
                    w,
                    n_uf_threshold=self.n_uf_threshold,
                    fan_in=info.fan_in,
                    u_min=self.grad_format.u_min,
                    u_max=self.grad_format.u_max,
                )
                unb = torch.tensor(u, dtype=_F32)
            else:
                unb = unbounded_scale_tensor(
                    g,
                    w,
                    n_uf_threshold=self.n_uf_threshold,
                    fan_in=info.fan_in,
                    u_min=self.grad_format.u_min,
                    u_max=self.grad_format.u_max,
                )
            info.last_unbounded = unb
            self.stat_computations += 1
        elif unb.device != g.device:
            unb = info.last_unbounded = unb.to(g.device)
        if host and prev.device.type == "cpu":
            s = bound_scale_host(
                float(unb) if u is None else u,
                float(prev),
                scale_upper_bound=self.scale_upper_bound,
                accum_upper_bound=self.accum_upper_bound,
                power_of_two=self.power_of_two,
            )
            return torch.tensor(s, dtype=_F32)
        if not self.power_of_two:
            return bound_scale_tensor(
                unb,
                prev,
                scale_upper_bound=self.scale_upper_bound,
                accum_upper_bound=self.accum_upper_bound,
                power_of_two=False,
            )
        return self._bound_in_parts(it, info, unb, prev)

    def _bound_in_parts(self, it: Iteration, info: Any, unb: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """:func:`bound_scale_tensor` with powers of two, in :mod:`.adaptive_rule`'s two parts: the layer's cap
        once per new unbounded scale, the headroom carried from layer to layer (four operations a layer)."""
        cap = self._caps.get(id(info))
        if cap is None or cap[0] is not unb:
            cap = self._caps[id(info)] = (unb, layer_cap(unb, scale_upper_bound=self.scale_upper_bound))
        in_id, out_id = info.scale_ids
        head = it.side[in_id]
        if head is None:  # where a scale starts (the loss) or branches merged: shared by the layers it reaches
            head = it.side[in_id] = headroom(prev, accum_upper_bound=self.accum_upper_bound)
        s = bound_from_parts(cap[1], head.to(cap[1].device))
        it.side[out_id] = pass_headroom(head, s.to(head.device))
        return s

    def agree_scales(self) -> None:
        """All-reduce MIN of the stored unbounded layer scales across replicas (no-op when not distributed)."""
        infos = self._layers + self._output_points
        if _world_size() <= 1 or not infos:
            return
        import torch.distributed as dist

        dev = next((i.last_unbounded.device for i in infos if i.last_unbounded is not None), None)
        if dev is None:
            dev = self._device
        if dist.get_backend() == "nccl" and dev.type != "cuda":
            dev = torch.device("cuda", torch.cuda.current_device())
        inf = torch.full((), float("inf"), dtype=_F32, device=dev)
        vec = torch.stack([i.last_unbounded.to(dev, _F32) if i.last_unbounded is not None else inf for i in infos])
        dist.all_reduce(vec, op=dist.ReduceOp.MIN)
        self._recorded_rows = None
        for info, v in zip(infos, vec):
            if info.last_unbounded is not None:  # layers without statistics (no input gradient) stay so
                info.last_unbounded = torch.where(torch.isfinite(v), v, torch.ones_like(v)).to(
                    info.last_unbounded.device
                )

    # -- introspection -------------------------------------------------------
    def _table_columns(self, k: int, info: Any, unbounded: float, ran: bool) -> dict[str, Any]:
        """The unbounded scale (the rule's statistic), also for a layer that did not run this step."""
        u = unbounded
        if info.last_unbounded is not None and not ran:
            u = float(info.last_unbounded)
        return {"unbounded_scale": None if u is None or math.isnan(u) else u}

    def state_dict(self) -> dict[str, Any]:
        rec = {i.name: r for i, r in self._recorded()}
        layers = {}
        for info in self._layers + self._output_points:
            s, p, _ = rec.get(info.name, (None, None, None))
            u = None if info.last_unbounded is None else float(info.last_unbounded)
            layers[info.name] = {
                "unbounded": u,
                "scale": s if info.applied else None,
                "prev_scale": p,
                "calls": info.calls,
            }
        return {
            "method": self.method,
            "iteration": self._iter,
            "init_scale": self.init_scale,
            "update_every": self.update_every,
            "layers": layers,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._recorded_rows = None
        self._iter = int(state.get("iteration", 0))
        for name, rec in state.get("layers", {}).items():
            info = self._by_name.get(name)
            if info is None:
                continue
            dev = (
                self._device
                if getattr(info, "is_point", False)
                else self._modules[self._layers.index(info)].weight.device
            )
            info.calls = int(rec.get("calls", 0))
            info.last_unbounded = (
                None if rec.get("unbounded") is None else torch.tensor(float(rec["unbounded"]), dtype=_F32, device=dev)
            )
            p = rec.get("prev_scale")
            s = rec.get("scale")
            info.last_prev = None if p is None else torch.tensor(float(p), dtype=_F32, device=dev)
            info.last_scale = None if (s is None or p is None) else torch.tensor(float(s), dtype=_F32, device=dev)
            info.applied = info.last_scale is not None

    def remove(self) -> None:
        """Restore the model exactly: the instance forwards and output-point hooks go, pending hooks are removed."""
        for h in self._point_handles:
            h.remove()
        self._point_handles = []
        super().remove()
