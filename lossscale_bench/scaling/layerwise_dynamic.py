"""Per-layer dynamic loss scaling (fairscale's ``LayerwiseGradientScaler``) on unmodified models.

The reference is ``fairscale/optim/layerwise_gradient_scaler.py``: every layer
keeps its own scale; after each step a layer whose parameter gradients hold an
inf/NaN multiplies its scale by ``backoff_factor`` (0.5) and resets its growth
tracker, every other layer counts a clean step and multiplies its scale by
``growth_factor`` (2) after ``growth_interval`` of them, clamped to
``[min_scale, max_scale]`` (fairscale's defaults: float32's tiny and max).
The optimizer step is skipped when *any* layer found an inf/NaN (fairscale's
``step``: ``if not inf_nan_found: optimizer.step()``), and the layers still
update their own scales on a skipped step; so does this scaler.

Where the scales sit. fairscale hooks every module in ``named_modules`` order
and multiplies a layer's input gradient by ``scale[i-1] / scale[i]``, which
assumes a chain. Here the per-layer scaling points are adaptive's
(:class:`~.per_layer.PointLossScaler`, shared with adaptive and amax): every stock Conv2d/Linear folds a
factor into its input-gradient product, merges of branches are brought to one
scale, parameter gradients are unscaled by the scale they carry; so it runs on
torchvision's SSDs as they are. The scale of *point j* is the absolute scale
``S_j`` of the gradient layer ``j`` sends upstream (its factor is
``S_j / P_j``, ``P_j`` the scale that arrived); point 0 is the loss. The
gradient is produced at ``S_j`` (not rescaled after it was rounded, as
fairscale's hook does), and the parameters upstream of ``j`` that receive it
carry ``S_j``: on a chain that is fairscale's per-layer scale of the layer
above ``j``, and it backs off when those parameters' gradients overflow.
Parameters reached through a merge carry the merged scale and report an
overflow to every branch's point. An overflow propagates upstream as inf/NaN
and makes the points above it back off too, as in fairscale. A point no
parameter gradient carried this step (the first conv's, whose input needs no
gradient) neither grows nor backs off.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..core.host_path import host_shortcuts
from ..precision.formats import FP16, FloatFormat
from .base import all_reduce_flag, distributed, unscale_groups_
from .per_layer import PointLossScaler
from .per_layer.graph import ROOT_SCALE_ID

__all__ = ["LayerwiseDynamicLossScaler"]

_F32 = torch.float32


class LayerwiseDynamicLossScaler(PointLossScaler):
    """A dynamic scale per scaling point (the loss and every Conv2d/Linear's input gradient)."""

    method = "layerwise_dynamic"
    metric_prefix = "lw_"
    #: the points' flags of a step come from one unscale of all gradients (:meth:`unscale_grads`)
    several_optimizers = False

    def __init__(
        self,
        model: nn.Module,
        init_scale: float = 65536.0,
        interval: int = 10000,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        min_scale: float | None = None,
        max_scale: float | None = None,
        *,
        grad_format: FloatFormat = FP16,
        **kwargs: Any,
    ) -> None:
        if int(interval) != interval or interval < 1:
            raise ValueError(f"interval must be a positive integer, got {interval}")
        if not growth_factor > 1.0 or not 0.0 < backoff_factor < 1.0:  # fairscale's assertions
            raise ValueError("growth_factor must be > 1 and backoff_factor in (0, 1)")
        super().__init__(model, init_scale=init_scale, grad_format=grad_format, **kwargs)
        self.interval = int(interval)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.min_scale = float(torch.finfo(_F32).tiny) if min_scale is None else float(min_scale)
        self.max_scale = float(torch.finfo(_F32).max) if max_scale is None else float(max_scale)
        self._scales = [float(init_scale)] * len(self.points)
        #: ``self._scales`` as 0-d tensors on the gradients' device, and the (device, scales) they were made of
        self._scale_t: tuple[torch.Tensor, ...] = ()
        self._scale_key: tuple | None = None
        self._trackers = [0] * len(self.points)
        #: per-point overflow flags (device) of the step in flight, set by unscale_
        self._point_flags: torch.Tensor | list[float] | None = None
        #: off the host, one worker: (the groups' flags on the device, each group's points) until step() reads them
        self._group_flags: tuple[torch.Tensor, list[tuple[int, ...]]] | None = None
        self._point_used: list[bool] = [False] * len(self.points)
        self.last_backoffs = 0

    # -- the rule ------------------------------------------------------------------
    def point_scale(self, k: int, grad: torch.Tensor, incoming: torch.Tensor, from_loss: bool) -> torch.Tensor:
        """Point ``k``'s own dynamic scale, set by :meth:`update` from its overflows (the 0-d tensors are made
        once per set of scales and device, not with a ``torch.full`` per layer and step)."""
        key = (grad.device, *self._scales)
        if self._scale_key != key:
            self._scale_t = torch.tensor(self._scales, dtype=_F32, device=grad.device).unbind()
            self._scale_key = key
        return self._scale_t[k]

    def _points_of(self, it, cache: dict):
        """``resolve(sid)``: the points whose scale source ``sid`` is (a merge: every branch's), per iteration."""
        key = id(it)
        if key in cache:
            return cache[key]
        direct: dict[int, tuple[int, ...]] = {ROOT_SCALE_ID: (0,)}
        for info, _in_id, out_id in it.layer_ids:
            if info is not None and id(info) in self._point:
                direct[out_id] = (self._point[id(info)],)
        merges = {m.out_id: m.ids for m in it.merges}
        resolved: dict[int, tuple[int, ...]] = {}

        def resolve(sid: int) -> tuple[int, ...]:
            if sid in resolved:
                return resolved[sid]
            if sid in direct:
                out = direct[sid]
            elif sid in merges:  # merges form a DAG (analyse's topological order): this ends
                out = tuple(sorted({p for b in merges[sid] for p in resolve(b)}))
            else:
                out = ()
            resolved[sid] = out
            return out

        cache[key] = resolve
        return resolve

    def unscale_grads(self, optimizer: torch.optim.Optimizer) -> None:
        """Adaptive's unscaling, with one non-finite flag per group of gradients sharing a point set."""
        if self._unscaled:
            return
        cache: dict = {}
        groups: dict[tuple, tuple[torch.Tensor | None, tuple[int, ...], list[torch.Tensor]]] = {}
        for p in (p for group in optimizer.param_groups for p in group["params"]):
            g = p.grad
            if g is None:
                continue
            target = self._carried.get(id(p))
            if target is None:
                val, pts = None, ()
            else:
                val, pts = target[0].vals[target[1]], self._points_of(target[0], cache)(target[1])
            key = (id(val) if val is not None else None, pts, g.device, g.dtype)
            groups.setdefault(key, (val, pts, []))[2].append(g)
        n = len(self.points)
        used = [False] * n
        point_sets = [pts for _, pts, _, _ in groups]
        for pts in point_sets:
            for k in pts:
                used[k] = True
        devices = {device for _, _, device, _ in groups}
        if len(devices) == 1:  # the groups' flags: rows of one buffer (two operations, not one zeros() a group)
            buffer = torch.zeros(len(groups), 1, dtype=_F32, device=devices.pop())
            founds = list(buffer.unbind(0))
        else:
            buffer = None
            founds = [torch.zeros(1, dtype=_F32, device=device) for _, _, device, _ in groups]
        unscale_groups_([(val, grads) for val, _, grads in groups.values()], founds)
        self._group_flags = None
        if not founds:
            self._found_inf = torch.zeros(())
            self._point_flags = None
        elif buffer is not None and not distributed() and (not host_shortcuts() or buffer.device.type != "cpu"):
            # one worker, off the host: the groups' flags stay on the device until step() reads the verdict, and
            # come to the host with it in one read (read_overflow); update() then needs no read
            self._group_flags = (buffer.reshape(-1), point_sets)
            self._found_inf = self._group_flags[0].amax().clamp(max=1.0)
            self._point_flags = None
        else:
            # each point's flag is the max over the groups it feeds, taken on the host from one read of the
            # groups' flags (step() reads the overflow flag there anyway): ~3 small tensor ops per point
            # and group cost ~1 ms a step on the CPU
            dev = founds[0].device
            host = self._point_flags_of(torch.cat([f.to(dev) for f in founds]).tolist(), point_sets)
            flags = all_reduce_flag(torch.tensor(host, dtype=_F32, device=dev))
            self._found_inf = flags.amax()
            # one worker: the flags are the host's own list (0.0 or 1.0), which update() then needs no read for
            self._point_flags = flags[:n] if distributed() else host[:n]
        self._point_used = used
        self._unscaled = True

    def _point_flags_of(self, per_group: list[float], point_sets: list[tuple[int, ...]]) -> list[float]:
        """Each point's flag (then slot n: gradients of no point), the max over the groups that carry it."""
        n = len(self.points)
        host = [0.0] * (n + 1)
        for v, pts in zip(per_group, point_sets):
            for k in pts or (n,):
                host[k] = max(host[k], min(v, 1.0))
        return host

    def read_overflow(self) -> bool:
        """The verdict, and the groups' flags kept on the device, in one read."""
        if self._group_flags is None:
            return super().read_overflow()
        per_group, point_sets = self._group_flags
        self._group_flags = None
        values = torch.cat([self._found_inf.reshape(1).to(per_group.device), per_group]).tolist()
        self._point_flags = self._point_flags_of(values[1:], point_sets)[: len(self.points)]
        return bool(values[0])

    def update_scale(self) -> None:
        if self._group_flags is not None:  # update() without step(): the flags are read here
            self.read_overflow()
        flags = self._point_flags
        self._point_flags = None
        super().update_scale()
        self.last_backoffs = 0
        if flags is None:
            return
        if isinstance(flags, torch.Tensor):
            flags = flags.tolist()
        for k, (bad, used) in enumerate(zip(flags, self._point_used)):
            if not used:
                continue
            s = self._scales[k]
            if bad:
                s = s * self.backoff_factor
                self._trackers[k] = 0
                self.last_backoffs += 1
            else:
                self._trackers[k] += 1
                if self._trackers[k] == self.interval:
                    s = s * self.growth_factor
                    self._trackers[k] = 0
            self._scales[k] = max(self.min_scale, min(s, self.max_scale))
        self.init_scale = self._scales[0]

    def current_scale(self) -> float:
        return self._scales[0]

    def set_scale(self, value: float) -> None:
        """``update(new_scale=value)``: the points' rules run, then the loss point's scale becomes ``value``."""
        super().set_scale(value)
        self._scales[0] = float(value)

    # -- introspection -------------------------------------------------------------
    def point_scales(self) -> dict[str, float]:
        return dict(zip(self.points, self._scales))

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        out["lw_points_backed_off"] = float(self.last_backoffs)
        return out

    def layer_table(self) -> list[dict[str, Any]]:
        rows = super().layer_table()
        for row, k in zip(rows, range(1, len(self.points))):
            row["growth_tracker"] = self._trackers[k]
        return rows

    def state_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "iteration": self._iter,
            "interval": self.interval,
            "scales": dict(zip(self.points, self._scales)),
            "growth_trackers": dict(zip(self.points, self._trackers)),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._iter = int(state.get("iteration", 0))
        for k, name in enumerate(self.points):
            if name in state.get("scales", {}):
                self._scales[k] = float(state["scales"][name])
                self._trackers[k] = int(state["growth_trackers"][name])
        self.init_scale = self._scales[0]
