"""The state of one backward pass of a per-layer loss scaler, hung on its autograd graph.

:class:`Iteration` holds the scale values of one ``scale(loss)``/backward, indexed by the scale source
ids of :mod:`.graph`; :meth:`Iteration.install` hangs it on the graph: ``node._ada = (iteration, in_id,
out_id)`` on each layer's backward node (the Function reads it back through ``ctx``, which is that
node), :func:`_merge_hook` on the consumers of merge points and :func:`_convert_hook` on parameter
gradients arriving at another scale than their ``.grad`` carries. The layer scale itself is the
scaler's public hook :meth:`~.scaler.PerLayerLossScaler.layer_factor`; the scaler is only reached
through the iteration, so this module never imports :mod:`.scaler`.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any

import torch

from ...core.host_path import host_shortcuts
from ...numerics.amax import max_abs as tensor_max_abs
from ...numerics.amax import max_abs_value
from ..adaptive_rule import branch_fallback_scale_host, branch_target_scale, branch_target_scale_host
from .functions import ATTACHED, SCALING_NODE_TYPES, LayerInfo, input_grad_weight
from .graph import ROOT_SCALE_ID, GraphPlan

__all__ = ["Iteration"]

_F32 = torch.float32

#: marker in PerLayerLossScaler._carried: the gradient is accumulated unscaled
_UNSCALED = None


class _Merge:
    __slots__ = ("out_id", "ids", "stash", "order")

    def __init__(self, out_id: int, ids: list[int]) -> None:
        self.out_id = out_id
        self.ids = ids
        self.stash: list[torch.Tensor | None] = [None] * len(ids)
        #: slots in arrival order: the sum follows it, as autograd's own accumulation would
        self.order: list[int] = []


class Iteration:
    """State of one ``scale(loss)``/backward: the scale values, indexed by scale source id."""

    # ``scaler``: the PerLayerLossScaler that owns this backward (not imported here: it imports us)
    def __init__(self, scaler: Any, n_ids: int, root_scale: torch.Tensor, recompute: bool) -> None:
        self.scaler = scaler
        self.vals: list[torch.Tensor | None] = [None] * n_ids
        self.vals[ROOT_SCALE_ID] = root_scale
        #: per scale id, a value a scaler's rule carries along with the scale (adaptive: the headroom under its
        #: accumulated bound, :mod:`..adaptive_rule`); None until the rule sets it. A rule reads the ids of
        #: the layer it is called for from ``layer.scale_ids``.
        self.side: list[torch.Tensor | None] = [None] * n_ids
        self.recompute = recompute
        self.merges: list[_Merge] = []
        self.layer_ids: list[tuple[Any, int, int]] = []
        #: hooks on this iteration's graph nodes (removed by the next scale() once a backward ran, or update())
        self.handles: list[Any] = []
        self.backward_done = False
        #: merges may see branches from several device threads (model parallel)
        self.lock = threading.Lock()

    def install(
        self, root: Any, plan: GraphPlan, carried: dict[int, tuple[Iteration, int] | None], unscaled: bool
    ) -> None:
        """Hook this backward into ``plan``'s graph; ``root`` is the scaled loss's ``grad_fn``.

        ``carried`` is the scaler's: per parameter, the (iteration, scale id) whose value its
        ``.grad`` carries, set by the first backward of a step (``_UNSCALED`` when ``unscaled``);
        later backward passes of the step convert their gradients to it.
        """
        self.handles.append(root.register_prehook(self.on_backward_start))
        for node, in_id, out_id in plan.layers:
            node._ada = (self, in_id, out_id)
            if not isinstance(node, SCALING_NODE_TYPES):  # another Function's layer (is_scaling_node)
                node.info = ATTACHED[node.layer_module]
                node.input_grad_weight = input_grad_weight
        #: (layer info, id of the scale arriving, id of the scale it sends upstream): per-layer scalers
        #: built on this machinery (the layer-wise dynamic one) read which parameters carry which layer's scale
        self.layer_ids = [(getattr(node, "info", None), in_id, out_id) for node, in_id, out_id in plan.layers]
        consumers: dict[int, tuple[Any, list[tuple[int, int, int]]]] = {}
        for spec in plan.merges:
            mi = len(self.merges)
            self.merges.append(_Merge(spec.out_id, [sid for _, _, sid in spec.edges]))
            for slot, (cnode, j, _) in enumerate(spec.edges):
                consumers.setdefault(id(cnode), (cnode, []))[1].append((j, mi, slot))
        for cnode, entries in consumers.values():
            entries.sort()
            self.handles.append(cnode.register_hook(_merge_hook(self, entries)))
        for acc, var, sid in plan.leaves:
            key = id(var)
            if key not in carried:
                carried[key] = _UNSCALED if unscaled else (self, sid)
            target = carried[key]
            if target is not None and target[0] is self and target[1] == sid:
                continue
            self.handles.append(acc.register_prehook(_convert_hook(self, sid, target)))

    def release(self) -> None:
        """Remove this backward's hooks and drop any gradient a merge still holds."""
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()
        for m in self.merges:  # a backward that failed half-way must not leave gradients stashed
            m.stash = [None] * len(m.ids)
            m.order = []

    def on_backward_start(self, grad_outputs):
        """Pre-hook of the root node: have the engine mark the end of this backward."""
        torch.autograd.Variable._execution_engine.queue_callback(self._mark_done)
        return None

    def _mark_done(self) -> None:
        self.backward_done = True
        for m in self.merges:
            m.stash = [None] * len(m.ids)
            m.order = []

    # called from the layers' backward
    def layer_backward(
        self, info: LayerInfo, g: torch.Tensor, w: torch.Tensor, in_id: int, out_id: int, need_input_grad: bool
    ) -> torch.Tensor | None:
        """The layer scale ``s`` (0-d fp32 tensor), or None when no input gradient is needed."""
        prev = self.vals[in_id]
        info.scale_ids = (in_id, out_id)
        if not need_input_grad:  # nothing upstream to scale
            self.vals[out_id] = prev
            info.record(None, prev)
            return None
        s = self.scaler.layer_factor(self, info, g, w, prev)
        self.vals[out_id] = prev * s
        info.record(s, prev)
        return s

    # called from the merge post-hooks
    def arrive(self, mi: int, slot: int, g: torch.Tensor | None) -> torch.Tensor | None:
        """Branch ``slot`` of merge ``mi`` delivers ``g``; the last one to arrive gets the merged sum."""
        m = self.merges[mi]
        with self.lock:
            m.stash[slot] = g
            m.order.append(slot)
            if len(m.order) < len(m.ids):
                return None
        try:
            return self._combine(m)
        finally:
            m.stash = [None] * len(m.ids)
            m.order = []

    def _combine(self, m: _Merge) -> torch.Tensor | None:
        scale_ts = [self.vals[sid] for sid in m.ids]
        live = [(m.stash[k], self.vals[m.ids[k]]) for k in m.order if m.stash[k] is not None]
        if not live:
            self.vals[m.out_id] = torch.stack(scale_ts).amax()
            return None
        # every branch scale is a candidate, also those of branches whose gradient is None (zero)
        u_max = self.scaler.grad_format.u_max
        t = None
        if host_shortcuts() and all(s.device.type == "cpu" and s.dtype == _F32 for s in scale_ts):
            # on the host: the same decision, without ~20 ops on 0-d tensors (branch_target_scale_host)
            max_abs = [0.0 if g is None else max_abs_value(g) for g in m.stash]
            scales = [s.item() for s in scale_ts]
            best = branch_target_scale_host(max_abs, scales, u_max)
            if best is not None:
                t = scale_ts[best]
            else:  # no branch fits (or a NaN): the fallback's value, also on the host where it can be
                value = branch_fallback_scale_host(max_abs, scales, u_max)
                if value is not None:
                    t = torch.tensor(value, dtype=_F32)
        if t is None:
            scales = torch.stack(scale_ts)
            t = branch_target_scale(_branch_max_abs(m.stash, scales.device), scales, u_max)
        self.vals[m.out_id] = t
        dtypes = {g.dtype for g, _ in live}  # one dtype, as a rule: no promotion to ask the dispatcher for
        dtype = dtypes.pop() if len(dtypes) == 1 else functools.reduce(torch.promote_types, (g.dtype for g, _ in live))
        total = None
        for g, s in live:
            factor = t / s
            if total is None:
                total = g.to(dtype) * factor
            else:
                total.addcmul_(g.to(dtype), factor)
        return total


def _branch_max_abs(stash: list[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """``max|g|`` of each branch (0 for none), stacked: one ``_foreach_norm`` (the inf norm is exactly ``max|g|``,
    NaN included) for the branches on ``device``, where one reduction a branch costs ~5 operations."""
    live = [g for g in stash if g is not None and g.numel() > 0 and g.device == device]
    norms = iter(torch._foreach_norm(live, math.inf) if live else ())
    zero = None
    out = []
    for g in stash:
        if g is not None and g.numel() > 0 and g.device == device:
            out.append(next(norms))
        elif g is not None and g.numel() > 0:  # another device (model parallel): its own reduction
            out.append(tensor_max_abs(g).to(device))
        else:
            zero = torch.zeros((), dtype=_F32, device=device) if zero is None else zero
            out.append(zero)
    return torch.stack(out)


def _merge_hook(it: Iteration, entries: list[tuple[int, int, int]]):
    def hook(grad_inputs, grad_outputs):
        gi = list(grad_inputs)
        for j, mi, slot in entries:
            gi[j] = it.arrive(mi, slot, gi[j])
        return tuple(gi)

    return hook


def _convert_hook(it: Iteration, x_id: int, target: tuple[Iteration, int] | None):
    """Pre-hook of a parameter's AccumulateGrad: bring its gradient from scale ``x_id`` to ``target``."""

    def hook(grad_outputs):
        g = grad_outputs[0]
        if g is None:
            return None
        x = it.vals[x_id]
        if x is None:
            return None
        c = 1.0 if target is None else target[0].vals[target[1]]
        return (g * (c / x).to(g.device),) + tuple(grad_outputs[1:])

    return hook
