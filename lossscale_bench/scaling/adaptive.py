"""Adaptive layer-wise loss scaling (Zhao et al. 2019), for unmodified PyTorch models.

The algorithm is ``docs/adaptive_algorithm.md`` (method ``approx_range``, the authors'
default); why it is built the way it is (a per-instance ``forward`` patch with a custom
autograd Function rather than backward hooks, a walk of the loss's graph to know which
scale each gradient carries, merges at branch points, unscaling per scale group), its
deviations from the Chainer reference and its limits are in ``docs/adaptive_design.md``.
Usage is GradScaler's::

    scaler = AdaptiveLossScaler(model)            # after precision.prepare(model)
    scaler.scale(loss).backward()
    result = scaler.step(optimizer)               # StepResult(skipped, scale, overflow)
    scaler.update()
    ...
    scaler.remove()                               # model restored exactly

Not supported (docs/adaptive_design.md "Limits"): double backward, reentrant checkpointing,
``torch.compile`` of the patched modules, two separately scaled losses in one backward,
``torch.autograd.grad`` with ``inputs``.
"""

from __future__ import annotations

import math
import statistics
import warnings
from typing import Any, Callable

import torch
from torch import nn

from ..formats import FP16, FloatFormat
from ._graph import analyse
from .adaptive_layers import (_ATTACHED, _SCALING_NODE_TYPES, _is_ours, _Iteration, _LayerInfo, _PatchedForward,
                              _point_hook, _PointInfo)
# rule names this module does not use are re-exported: tests and callers import them from here
from .adaptive_rule import (MIN_BRANCH_SCALE, U_MAX, U_MIN, approx_range_scale, approx_range_scale_tensor,
                            backward_fan_in, bound_scale_tensor, branch_target_scale, output_scale_tensor,
                            unbounded_scale_tensor, underflow_k)
from .base import LossScaler, all_reduce_flag, unscale_group_

__all__ = ["AdaptiveLossScaler", "approx_range_scale", "approx_range_scale_tensor", "unbounded_scale_tensor",
           "bound_scale_tensor", "branch_target_scale", "backward_fan_in", "output_scale_tensor",
           "find_output_points", "UPDATE_COUNTS", "U_MIN", "U_MAX"]

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
                points.append((f"{name}.module_list.{i}/output", conv, "class_output" if is_cls else "box_output",
                               is_cls))
    return points


def _world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


class AdaptiveLossScaler(LossScaler):
    """Adaptive layer-wise loss scaling on an unmodified model (see module doc).

    Options as in docs/adaptive_algorithm.md. Keyword-only extras: ``sync_scales`` (all-reduce MIN
    of recomputed unbounded scales when distributed and ``update_every > 1``),
    ``unscale_in_backward`` (None: only for a model wrapped in DDP), ``scale_fn``
    (test hook: ``fn(layer_name, grad, weight, prev_scale) -> scale`` replaces
    steps 1-9), ``layer_types`` (a subset of Conv2d/Linear to scale), ``grad_format`` (the
    gradients' format, :mod:`lossscale_bench.formats`; fp16 by default, E5M2 under
    ``fp8-emulated``: ``u_min``/``u_max`` of steps 5-6 and of branch merges come from it, as the
    reference's ``get_range(dtype)``), ``output_scaling`` (add the reference's later head-output and
    L2Norm-input scaling points; module doc), ``update_count`` (``"steps"``: ``update_every`` counts
    optimizer steps; ``"calls"``: each layer's backward calls, as the reference).
    """

    method = "adaptive"

    def __init__(self, model: nn.Module, update_every: int = 1, init_scale: float = 1.0,
                 n_uf_threshold: float = 1e-3, scale_upper_bound: float = 16.0,
                 accum_upper_bound: float = 1024.0, power_of_two: bool = True, *,
                 sync_scales: bool = True, unscale_in_backward: bool | None = None,
                 scale_fn: Callable[[str, torch.Tensor, torch.Tensor, torch.Tensor], Any] | None = None,
                 layer_types: tuple[type, ...] = (nn.Conv2d, nn.Linear), grad_format: FloatFormat = FP16,
                 output_scaling: bool = False, update_count: str = "steps") -> None:
        super().__init__()
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
        self.update_every = int(update_every)
        self.update_count = update_count
        self.output_scaling = bool(output_scaling)
        self.init_scale = float(init_scale)
        self.n_uf_threshold = float(n_uf_threshold)
        self.scale_upper_bound = float(scale_upper_bound)
        self.accum_upper_bound = float(accum_upper_bound)
        self.power_of_two = bool(power_of_two)
        self.sync_scales = bool(sync_scales)
        self.scale_fn = scale_fn
        #: the format the gradients live in: its range is the rule's [u_min, u_max]
        self.grad_format = grad_format
        is_ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        self.unscale_in_backward = is_ddp if unscale_in_backward is None else bool(unscale_in_backward)
        if is_ddp:
            model = model.module
        self._model: nn.Module | None = model
        self._layers: list[_LayerInfo] = []
        self._modules: list[nn.Module] = []
        self._by_name: dict[str, _LayerInfo] = {}
        #: (name, reason) of matching modules left unwrapped (they pass the scale through)
        self.skipped_layers: list[tuple[str, str]] = []
        #: output scaling points (``output_scaling``), each with its forward hook
        self._points: list[_PointInfo] = []
        self._point_handles: list[Any] = []
        self._device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self._attach_layers(model, layer_types)
        if self.output_scaling:
            self._attach_output_points(model)
        if self.skipped_layers:
            warnings.warn(f"adaptive loss scaling leaves {len(self.skipped_layers)} layer(s) unscaled: "
                          f"{self.skipped_layers[:3]}", stacklevel=2)

        self._iter = 0
        #: iterations whose hooks may still be registered (normally only the current one)
        self._pending: list[_Iteration] = []
        self._recomputed = False
        #: id(param) -> (iteration, scale id) whose value the param's .grad carries, or _UNSCALED (None; adaptive_layers)
        self._carried: dict[int, tuple[_Iteration, int] | None] = {}
        #: number of statistics computations (steps 1-6) since construction
        self.stat_computations = 0
        self._last_plan = {"nodes": 0, "merge_points": 0, "layers": 0}

    def _attach_layers(self, model: nn.Module, layer_types) -> None:
        """Patch each stock Conv2d/Linear's instance ``forward`` (docs/adaptive_design.md: why a
        patch and not a hook); a module already attached to another scaler is refused."""
        stock = {nn.Conv2d: nn.Conv2d.forward, nn.Linear: nn.Linear.forward}
        for name, mod in model.named_modules():
            if not isinstance(mod, layer_types) or not isinstance(mod, (nn.Conv2d, nn.Linear)):
                continue
            if _ATTACHED.get(mod) is not None:
                self._detach_modules()
                raise ValueError(f"module {name!r} already has an adaptive loss scaler attached")
            base = nn.Conv2d if isinstance(mod, nn.Conv2d) else nn.Linear
            if type(mod).forward is not stock[base]:
                self.skipped_layers.append((name, "class overrides forward"))
                continue
            if "forward" in mod.__dict__ and not _is_ours(mod.__dict__["forward"]):  # ours: a stale copy
                self.skipped_layers.append((name, "instance forward already patched"))
                continue
            info = _LayerInfo(name or type(mod).__name__, mod)
            _ATTACHED[mod] = info
            mod.forward = _PatchedForward(mod)
            self._layers.append(info)
            self._modules.append(mod)
            self._by_name[info.name] = info

    def _attach_output_points(self, model: nn.Module) -> None:
        """The reference's later scaling points (head outputs, L2Norm input), as forward hooks."""
        for name, mod, kind, lognormal in find_output_points(model):
            info = _PointInfo(name, kind, lognormal)
            self._points.append(info)
            self._by_name[info.name] = info
            self._point_handles.append(mod.register_forward_hook(_point_hook(info)))
        if not self._points:
            warnings.warn("output_scaling: the model has no SSD head or marked module; nothing added",
                          stacklevel=3)

    # -- the loop's interface ------------------------------------------------
    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        if self._model is None:
            raise RuntimeError("scaler was removed from its model")
        # hooks of a finished backward go now: a parameter's AccumulateGrad node can outlive its graph
        for it in self._pending:
            if it.backward_done:
                it.release()
        self._pending = [it for it in self._pending if it.handles]
        scaled = loss * self.init_scale if self.init_scale != 1.0 else loss
        root = scaled.grad_fn
        if root is None:
            return scaled
        plan = analyse(root, lambda n: isinstance(n, _SCALING_NODE_TYPES))
        recompute = self._iter % self.update_every == 0
        self._recomputed |= recompute and self.update_count == "steps"
        it = _Iteration(self, plan.n_ids, torch.full((), self.init_scale, dtype=_F32, device=loss.device), recompute)
        it.install(root, plan, self._carried, self.unscale_in_backward)
        self._last_plan = {"nodes": plan.n_nodes, "merge_points": len(plan.merges), "layers": len(plan.layers)}
        self._pending.append(it)
        return scaled

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide each parameter gradient by the scale it carries; one fused non-finite check per group."""
        if self._unscaled:
            return
        groups: dict[tuple, tuple[torch.Tensor | None, list[torch.Tensor]]] = {}
        for g, p in ((p.grad, p) for group in optimizer.param_groups for p in group["params"]):
            if g is None:
                continue
            target = self._carried.get(id(p))
            val = None if target is None else target[0].vals[target[1]]
            key = (id(val) if val is not None else None, g.device, g.dtype)
            groups.setdefault(key, (val, []))[1].append(g)
        found_by_dev: dict[torch.device, torch.Tensor] = {}
        for (_, device, _), (val, grads) in groups.items():
            found = found_by_dev.setdefault(device, torch.zeros(1, dtype=_F32, device=device))
            unscale_group_(grads, val, found)
        if found_by_dev:
            flags = list(found_by_dev.values())
            dev = flags[0].device
            found = torch.stack([f.to(dev) for f in flags]).amax().clamp(max=1.0)
        else:
            found = torch.zeros(())
        self._found_inf = all_reduce_flag(found)
        self._unscaled = True

    def update(self) -> None:
        super().update()
        if self._recomputed and self.sync_scales and self.update_every > 1 and _world_size() > 1:
            self.agree_scales()
        self._recomputed = False
        self._iter += 1
        self._carried.clear()
        self._release_pending()

    def current_scale(self) -> float:
        return self.init_scale

    # -- internals -------------------------------------------------------------
    def _layer_scale(self, it: _Iteration, info: _LayerInfo, g: torch.Tensor, w: torch.Tensor,
                     prev: torch.Tensor) -> torch.Tensor:
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
        if recompute or unb is None:
            if getattr(info, "is_point", False):
                unb = output_scale_tensor(g, lognormal=info.lognormal, n_uf_threshold=self.n_uf_threshold,
                                          u_min=self.grad_format.u_min, u_max=self.grad_format.u_max)
            else:
                unb = unbounded_scale_tensor(g, w, n_uf_threshold=self.n_uf_threshold, fan_in=info.fan_in,
                                             u_min=self.grad_format.u_min, u_max=self.grad_format.u_max)
            info.last_unbounded = unb
            self.stat_computations += 1
        elif unb.device != g.device:
            unb = info.last_unbounded = unb.to(g.device)
        return bound_scale_tensor(unb, prev, scale_upper_bound=self.scale_upper_bound,
                                  accum_upper_bound=self.accum_upper_bound, power_of_two=self.power_of_two)

    def _release_pending(self) -> None:
        for it in self._pending:
            it.release()
        self._pending = []

    def agree_scales(self) -> None:
        """All-reduce MIN of the stored unbounded layer scales across replicas (no-op when not distributed)."""
        infos = self._layers + self._points
        if _world_size() <= 1 or not infos:
            return
        import torch.distributed as dist

        dev = next((i.last_unbounded.device for i in infos if i.last_unbounded is not None), None)
        if dev is None:
            dev = self._device
        if dist.get_backend() == "nccl" and dev.type != "cuda":
            dev = torch.device("cuda", torch.cuda.current_device())
        inf = torch.full((), float("inf"), dtype=_F32, device=dev)
        vec = torch.stack([i.last_unbounded.to(dev, _F32) if i.last_unbounded is not None else inf
                           for i in infos])
        dist.all_reduce(vec, op=dist.ReduceOp.MIN)
        for info, v in zip(infos, vec):
            if info.last_unbounded is not None:  # layers without statistics (no input gradient) stay so
                info.last_unbounded = torch.where(torch.isfinite(v), v, torch.ones_like(v)).to(
                    info.last_unbounded.device)

    def _detach_modules(self) -> None:
        for mod in self._modules:
            if _is_ours(mod.__dict__.get("forward")):
                del mod.__dict__["forward"]
            _ATTACHED.pop(mod, None)
        self._modules = []

    # -- introspection -------------------------------------------------------
    def _recorded(self) -> list[tuple[_LayerInfo, list[float]]]:
        """(info, [scale, prev, unbounded]) for layers that ran; one device->host copy."""
        rows = [i for i in self._layers + self._points if i.last_prev is not None]
        if not rows:
            return []
        dev = rows[0].last_prev.device
        nan = torch.full((), float("nan"), dtype=_F32, device=dev)

        def v(t):
            return nan if t is None else t.to(dev, _F32).reshape(())

        mat = torch.stack([torch.stack([v(i.last_scale), v(i.last_prev), v(i.last_unbounded)]) for i in rows])
        return list(zip(rows, mat.cpu().tolist()))

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"loss_scale": self.init_scale}
        rec = self._recorded()
        scales = [math.log2(s) for i, (s, _, _) in rec if i.applied and s > 0]
        accum = [math.log2(p * (s if i.applied else 1.0)) for i, (s, p, _) in rec
                 if p > 0 and (not i.applied or s > 0) and math.isfinite(p)]
        if scales:
            out.update(ada_scale_log2_min=min(scales), ada_scale_log2_median=float(statistics.median(scales)),
                       ada_scale_log2_max=max(scales))
        if accum:
            out.update(ada_accum_scale_log2_min=min(accum), ada_accum_scale_log2_max=max(accum))
        out["ada_merge_points"] = float(self._last_plan["merge_points"])
        return out

    def layer_table(self) -> list[dict[str, Any]]:
        vals = {i.name: r for i, r in self._recorded()}
        table = []
        for info in self._layers + self._points:
            s, p, u = vals.get(info.name, (float("nan"),) * 3)
            if info.last_unbounded is not None and info.name not in vals:
                u = float(info.last_unbounded)
            applied = info.applied and info.name in vals
            scale = s if applied else 1.0
            u = None if u is None or math.isnan(u) else u
            table.append({"layer": info.name, "type": info.kind, "fan_in": info.fan_in, "applied": applied,
                          "scale": scale, "prev_scale": p, "accum_scale": p * scale, "unbounded_scale": u})
        return table

    def state_dict(self) -> dict[str, Any]:
        rec = {i.name: r for i, r in self._recorded()}
        layers = {}
        for info in self._layers + self._points:
            s, p, _ = rec.get(info.name, (None, None, None))
            u = None if info.last_unbounded is None else float(info.last_unbounded)
            layers[info.name] = {"unbounded": u, "scale": s if info.applied else None, "prev_scale": p,
                                 "calls": info.calls}
        return {"method": self.method, "iteration": self._iter, "init_scale": self.init_scale,
                "update_every": self.update_every, "layers": layers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._iter = int(state.get("iteration", 0))
        for name, rec in state.get("layers", {}).items():
            info = self._by_name.get(name)
            if info is None:
                continue
            dev = (self._device if getattr(info, "is_point", False)
                   else self._modules[self._layers.index(info)].weight.device)
            info.calls = int(rec.get("calls", 0))
            info.last_unbounded = (None if rec.get("unbounded") is None
                                   else torch.tensor(float(rec["unbounded"]), dtype=_F32, device=dev))
            p = rec.get("prev_scale")
            s = rec.get("scale")
            info.last_prev = None if p is None else torch.tensor(float(p), dtype=_F32, device=dev)
            info.last_scale = None if (s is None or p is None) else torch.tensor(float(s), dtype=_F32, device=dev)
            info.applied = info.last_scale is not None

    @property
    def layer_names(self) -> list[str]:
        return [i.name for i in self._layers]

    def remove(self) -> None:
        """Restore the model exactly: the instance forwards and output-point hooks go, pending hooks are removed."""
        for h in self._point_handles:
            h.remove()
        self._point_handles = []
        self._detach_modules()
        self._release_pending()
        self._carried.clear()
        self._model = None
