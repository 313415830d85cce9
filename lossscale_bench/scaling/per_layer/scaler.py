"""The base of every per-layer loss scaler: a scale per Conv2d/Linear on an unmodified model.

Why a base: adaptive (:mod:`lossscale_bench.scaling.adaptive`), layer-wise dynamic
(:mod:`lossscale_bench.scaling.layerwise_dynamic`) and amax (:mod:`lossscale_bench.scaling.amax`) share
all the machinery of this package (:mod:`.functions`, :mod:`.iteration`, :mod:`.graph`: each stock
``nn.Conv2d``/``nn.Linear`` gets an instance ``forward`` whose backward folds a factor into
its input-gradient product, branch merges are brought to one scale, every parameter gradient
is unscaled by the scale it carries) and differ only in how a layer's scale is chosen. That
choice is one public hook, so a new per-layer method is a subclass that writes its rule and
nothing else (README "Adding a method or a precision"):

* :class:`PerLayerLossScaler` -- override :meth:`~PerLayerLossScaler.layer_factor`, which returns
  the *factor* a layer multiplies into the gradient it sends upstream (the adaptive rule bounds
  exactly that factor, relative to the scale that arrived);
* :class:`PointLossScaler` -- for rules that keep an *absolute* scale per scaling point (point 0:
  the loss, point k: the input gradient of the k-th wrapped layer): override
  :meth:`~PointLossScaler.point_scale`; the base turns it into the factor, sets the loss's scale
  from :meth:`current_scale`, and logs and tabulates the points' scales.

What every per-layer scaler logs (its :attr:`~PerLayerLossScaler.metric_prefix` first):
``<prefix>scale_log2_min|median|max`` (the log2 of the factors the layers applied, last step),
``<prefix>accum_scale_log2_min|max`` and ``<prefix>merge_points``; a point scaler adds
``<prefix>point_scale_log2_min|median|max``. ``lsbench report --telemetry`` shows a method's layer
scales from the metric ending in :data:`~lossscale_bench.core.registry.LAYER_SCALE_SUFFIX`, so a
subclass shows them there with no edit to the report.
"""

from __future__ import annotations

import math
import statistics
import warnings
import weakref
from abc import abstractmethod
from typing import Any

import torch
from torch import nn

from ...core.registry import LAYER_SCALE_SUFFIX
from ...precision.formats import FP16, FloatFormat
from ..base import LossScaler, all_reduce_flag, unscale_groups_
from .functions import ATTACHED, LayerInfo, PatchedForward, is_ours, is_scaling_node
from .graph import ROOT_SCALE_ID, analyse
from .iteration import Iteration

__all__ = ["PerLayerLossScaler", "PointLossScaler", "LOSS_POINT"]

_F32 = torch.float32
#: the name of point 0 (the loss) in a point scaler's tables and checkpoints
LOSS_POINT = "<loss>"


class PerLayerLossScaler(LossScaler):
    """A loss scaler that scales every stock Conv2d/Linear's input gradient by a factor of its own.

    Subclasses validate their options *before* calling ``super().__init__`` (which patches the
    model: a refused option must leave it untouched) and implement :meth:`layer_factor`. A rule that
    must know whether a step was skipped overrides :meth:`~LossScaler.after_step` (called with each
    step's :class:`~lossscale_bench.scaling.base.StepResult`) or reads :attr:`last_step` /
    :attr:`overflowed` in :meth:`update_scale`.
    ``grad_format`` is the format the gradients live in (the precision's; fp16 by default): its
    range bounds branch merges. ``unscale_in_backward`` (None: only for a model wrapped in DDP)
    unscales parameter gradients as they arrive; ``layer_types`` picks a subset of Conv2d/Linear.
    """

    #: prefix of the metrics this scaler logs (module doc); a subclass sets its own
    metric_prefix = "layer_"
    #: one loss per backward: the layers' scales follow that loss's graph (two separately scaled losses in one
    #: backward are not supported), so :meth:`scale` refuses an iterable of several
    several_outputs = False

    def __init__(
        self,
        model: nn.Module,
        init_scale: float = 1.0,
        *,
        grad_format: FloatFormat = FP16,
        unscale_in_backward: bool | None = None,
        layer_types: tuple[type, ...] = (nn.Conv2d, nn.Linear),
    ) -> None:
        super().__init__()
        if model is None:
            raise ValueError(f"{self.method} loss scaling needs the model")
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        self.init_scale = float(init_scale)
        #: the format the gradients live in: its range bounds the merges (and the adaptive rule)
        self.grad_format = grad_format
        is_ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        self.unscale_in_backward = is_ddp if unscale_in_backward is None else bool(unscale_in_backward)
        if is_ddp:
            model = model.module
        self._model: nn.Module | None = model
        self._layers: list[LayerInfo] = []
        self._modules: list[nn.Module] = []
        self._by_name: dict[str, Any] = {}
        #: (name, reason) of matching modules left unwrapped (they pass the scale through)
        self.skipped_layers: list[tuple[str, str]] = []
        #: scaling points on module outputs (adaptive's ``output_scaling``), recorded like layers
        self._output_points: list[Any] = []
        self._device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self._attach_layers(model, layer_types)
        if self.skipped_layers:
            warnings.warn(
                f"{self.method} loss scaling leaves {len(self.skipped_layers)} layer(s) unscaled: "
                f"{self.skipped_layers[:3]}",
                stacklevel=3,
            )
        self._iter = 0
        #: iterations whose hooks may still be registered (normally only the current one)
        self._pending: list[Iteration] = []
        #: id(param) -> (iteration, scale id) whose value the param's .grad carries, or None (unscaled)
        self._carried: dict[int, tuple[Iteration, int] | None] = {}
        self._last_plan = {"nodes": 0, "merge_points": 0, "layers": 0}
        #: what _recorded() read this step (None: not read since the last backward, update or load)
        self._recorded_rows: list[tuple[Any, list[float]]] | None = None

    # -- the hook -----------------------------------------------------------------
    @abstractmethod
    def layer_factor(
        self, it: Iteration, layer: Any, grad: torch.Tensor, weight: torch.Tensor | None, incoming: torch.Tensor
    ) -> torch.Tensor:
        """The factor ``s`` (a 0-d fp32 tensor) ``layer`` multiplies into the gradient it sends upstream.

        Called once per layer and backward, from that layer's backward, with the gradient arriving
        at its output (``grad``, carrying the scale ``incoming``, a 0-d tensor) and its weight
        (None for an output point). The gradient sent upstream then carries ``incoming * s``;
        the layer's own scale is ``s`` and its absolute one ``incoming * s``. ``it`` is the
        backward pass (``it.recompute``: whether statistics are due this step).
        """

    def _iteration_recomputes(self) -> bool:
        """Whether the backward that starts now recomputes statistics (every step here)."""
        return True

    def _attach_layers(self, model: nn.Module, layer_types) -> None:
        """Patch each stock Conv2d/Linear's instance ``forward`` (docs/development/adaptive-design.md: why a
        patch and not a hook); a module already attached to another scaler is refused."""
        stock = {nn.Conv2d: nn.Conv2d.forward, nn.Linear: nn.Linear.forward}
        for name, mod in model.named_modules():
            if not isinstance(mod, layer_types) or not isinstance(mod, (nn.Conv2d, nn.Linear)):
                continue
            held = ATTACHED.get(mod)
            if held is not None:
                self._detach_modules()
                owner = held.owner() if getattr(held, "owner", None) is not None else None
                who = "another per-layer loss scaler" if owner is None else repr(owner)
                raise ValueError(
                    f"module {name!r} is already held by {who}: call that scaler's remove() "
                    "(or leave its `with` block) before attaching another"
                )
            base = nn.Conv2d if isinstance(mod, nn.Conv2d) else nn.Linear
            if type(mod).forward is not stock[base]:
                self.skipped_layers.append((name, "class overrides forward"))
                continue
            if "forward" in mod.__dict__ and not is_ours(mod.__dict__["forward"]):  # ours: a stale copy
                self.skipped_layers.append((name, "instance forward already patched"))
                continue
            info = LayerInfo(name or type(mod).__name__, mod)
            info.owner = weakref.ref(self)  # named in the refusal of a second scaler
            ATTACHED[mod] = info
            mod.forward = PatchedForward(mod)
            self._layers.append(info)
            self._modules.append(mod)
            self._by_name[info.name] = info

    # -- the loop's interface ------------------------------------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        if self._model is None:
            raise RuntimeError("scaler was removed from its model")
        self._recorded_rows = None
        # hooks of a finished backward go now: a parameter's AccumulateGrad node can outlive its graph
        for it in self._pending:
            if it.backward_done:
                it.release()
        self._pending = [it for it in self._pending if it.handles]
        scaled = loss * self.init_scale if self.init_scale != 1.0 else loss
        root = scaled.grad_fn
        if root is None:
            return scaled
        plan = analyse(root, is_scaling_node)
        recompute = self._iteration_recomputes()
        it = Iteration(self, plan.n_ids, torch.full((), self.init_scale, dtype=_F32, device=loss.device), recompute)
        it.install(root, plan, self._carried, self.unscale_in_backward)
        self._last_plan = {"nodes": plan.n_nodes, "merge_points": len(plan.merges), "layers": len(plan.layers)}
        self._pending.append(it)
        return scaled

    def unscale_grads(self, optimizer: torch.optim.Optimizer) -> None:
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
        founds = [found_by_dev.setdefault(device, torch.zeros(1, dtype=_F32, device=device)) for _, device, _ in groups]
        unscale_groups_(list(groups.values()), founds)
        if found_by_dev:
            flags = list(found_by_dev.values())
            dev = flags[0].device
            found = torch.stack([f.to(dev) for f in flags]).amax().clamp(max=1.0)
        else:
            found = torch.zeros(())
        self._found_inf = all_reduce_flag(found)
        self._unscaled = True

    def update_scale(self) -> None:
        super().update_scale()
        self._recorded_rows = None
        self._iter += 1
        self._carried.clear()
        self._release_pending()

    def current_scale(self) -> float:
        return self.init_scale

    def set_scale(self, value: float) -> None:
        """``update(new_scale=value)``: the step's bookkeeping as :meth:`update` does, then the loss's scale
        (the scale every backward starts with) becomes ``value``."""
        if not value > 0:
            raise ValueError(f"new_scale must be > 0, got {value}")
        self.update_scale()
        self.init_scale = float(value)

    def __repr__(self) -> str:
        model = "removed" if self._model is None else type(self._model).__name__
        return f"<{type(self).__name__} method={self.method!r} model={model} id=0x{id(self):x}>"

    def _release_pending(self) -> None:
        for it in self._pending:
            it.release()
        self._pending = []

    def _detach_modules(self) -> None:
        for mod in self._modules:
            if is_ours(mod.__dict__.get("forward")):
                del mod.__dict__["forward"]
            ATTACHED.pop(mod, None)
        self._modules = []

    def remove(self) -> None:
        """Restore the model exactly: the instance forwards go, pending hooks are removed."""
        self._detach_modules()
        self._release_pending()
        self._carried.clear()
        self._model = None

    # -- introspection -------------------------------------------------------
    @property
    def layer_names(self) -> list[str]:
        return [i.name for i in self._layers]

    def _recorded(self) -> list[tuple[Any, list[float]]]:
        """(info, [scale, prev, unbounded]) for layers that ran; one device->host copy a step (kept until the
        next backward, update or load: a logged step's metrics and layer table share it)."""
        if self._recorded_rows is None:
            self._recorded_rows = self._read_recorded()
        return self._recorded_rows

    def _read_recorded(self) -> list[tuple[Any, list[float]]]:
        rows = [i for i in self._layers + self._output_points if i.last_prev is not None]
        if not rows:
            return []
        dev = rows[0].last_prev.device
        nan = torch.full((), float("nan"), dtype=_F32, device=dev)

        def v(t):
            return nan if t is None else t.to(dev, _F32).reshape(())

        mat = torch.stack([torch.stack([v(i.last_scale), v(i.last_prev), v(i.last_unbounded)]) for i in rows])
        return list(zip(rows, mat.cpu().tolist()))

    def metrics(self) -> dict[str, float]:
        """``loss_scale`` and the layers' scales of the last step, in log2 (module doc)."""
        p = self.metric_prefix
        out: dict[str, float] = {"loss_scale": float(self.current_scale())}
        rec = self._recorded()
        scales = [math.log2(s) for i, (s, _, _) in rec if i.applied and s > 0]
        accum = [
            math.log2(q * (s if i.applied else 1.0))
            for i, (s, q, _) in rec
            if q > 0 and (not i.applied or s > 0) and math.isfinite(q)
        ]
        if scales:
            out.update(
                {
                    f"{p}scale_log2_min": min(scales),
                    f"{p}{LAYER_SCALE_SUFFIX}": float(statistics.median(scales)),
                    f"{p}scale_log2_max": max(scales),
                }
            )
        if accum:
            out.update({f"{p}accum_scale_log2_min": min(accum), f"{p}accum_scale_log2_max": max(accum)})
        out[f"{p}merge_points"] = float(self._last_plan["merge_points"])
        return out

    def layer_table(self) -> list[dict[str, Any]]:
        """One row per layer (then output point): its scale, the scale that arrived, their product,
        and the columns :meth:`_table_columns` adds."""
        vals = {i.name: r for i, r in self._recorded()}
        table = []
        for k, info in enumerate(self._layers + self._output_points):
            s, p, u = vals.get(info.name, (float("nan"),) * 3)
            applied = info.applied and info.name in vals
            scale = s if applied else 1.0
            table.append(
                {
                    "layer": info.name,
                    "type": info.kind,
                    "fan_in": info.fan_in,
                    "applied": applied,
                    "scale": scale,
                    "prev_scale": p,
                    "accum_scale": p * scale,
                    **self._table_columns(k, info, u, info.name in vals),
                }
            )
        return table

    def _table_columns(self, k: int, info: Any, unbounded: float, ran: bool) -> dict[str, Any]:
        """A subclass's own columns for row ``k`` (``unbounded``: the recorded statistic, nan if none)."""
        return {}


class PointLossScaler(PerLayerLossScaler):
    """A per-layer scaler that keeps an absolute scale per scaling point (module doc).

    Point 0 is the loss (:data:`LOSS_POINT`), point ``k >= 1`` the input gradient of the k-th
    wrapped layer (:attr:`points` names them). A subclass implements :meth:`point_scale` and
    :meth:`point_scales`, and :meth:`current_scale` (the loss's scale, point 0) where that is not
    the constant ``init_scale``.
    """

    def __init__(self, model: nn.Module, init_scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(model, init_scale=init_scale, **kwargs)
        #: point names: the loss, then every wrapped layer (``self._layers`` order)
        self.points = [LOSS_POINT] + [i.name for i in self._layers]
        self._point = {id(info): k + 1 for k, info in enumerate(self._layers)}

    @abstractmethod
    def point_scale(self, k: int, grad: torch.Tensor, incoming: torch.Tensor, from_loss: bool) -> torch.Tensor:
        """The absolute scale ``S_k`` (0-d fp32 tensor) of the gradient point ``k``'s layer sends upstream.

        ``grad`` is the gradient arriving at that layer's output, carrying the scale ``incoming``
        (0-d tensor; in true units it is ``grad / incoming``); ``from_loss`` says it came straight
        from the loss (the loss point's scale is the scaler's :meth:`current_scale`). The layer
        applies the factor ``S_k / incoming``.
        """

    @abstractmethod
    def point_scales(self) -> dict[str, float]:
        """Point name -> its current absolute scale (the loss first)."""

    def layer_factor(
        self, it: Iteration, layer: Any, grad: torch.Tensor, weight: torch.Tensor | None, incoming: torch.Tensor
    ) -> torch.Tensor:
        """``point_scale / incoming`` on ``grad``'s device."""
        target = self.point_scale(self._point[id(layer)], grad, incoming, incoming is it.vals[ROOT_SCALE_ID])
        return (target / incoming.to(device=target.device, dtype=_F32)).to(grad.device)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Multiply ``loss`` by point 0's scale: the machinery starts every backward at ``init_scale``."""
        self.init_scale = self.current_scale()
        return super().scale_loss(loss)

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        p = self.metric_prefix
        logs = [math.log2(s) for s in self.point_scales().values() if s > 0]
        out.update(
            {
                f"{p}point_scale_log2_min": min(logs),
                f"{p}point_{LAYER_SCALE_SUFFIX}": float(statistics.median(logs)),
                f"{p}point_scale_log2_max": max(logs),
            }
        )
        return out

    def layer_table(self) -> list[dict[str, Any]]:
        """The layers' rows with each point's absolute scale (row ``k`` is point ``k + 1``)."""
        rows = super().layer_table()
        scales = list(self.point_scales().values())
        for k, row in zip(range(1, len(self.points)), rows):
            row["point_scale"] = scales[k]
        return rows
