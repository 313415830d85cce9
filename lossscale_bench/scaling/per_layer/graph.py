"""Static analysis of one iteration's autograd graph for adaptive loss scaling.

Adaptive scaling changes the scale a gradient carries at every Conv2d/Linear
(their backward nodes are the *scaling nodes* here). Every other node passes
the scale of the gradient arriving at it through unchanged. So, before the
backward pass runs, one walk over ``loss.grad_fn`` tells

* for every node, which *scale source* its incoming gradient carries: the
  loss (id 0), the input-gradient output of a scaling node, or a *merge*;
* where gradients with different scale sources meet (a tensor feeding
  several consumers: VGG feature maps tapped by multibox heads, residual
  additions, ...). Those are the merge points where the branches must be
  brought to one scale before autograd sums them;
* which scale every parameter gradient (``AccumulateGrad`` node) carries.

Scale sources are symbolic integers; their values are 0-d device tensors
computed during backward, in topological order, so a source's value always
exists before a node that depends on it runs. Nothing here touches tensors
or registers hooks: the caller does that from the returned plan and then
drops it (the plan holds graph nodes; keeping it would keep the graph alive).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: scale source of the gradient the loss starts with (``init_scale``)
ROOT_SCALE_ID = 0


@dataclass
class MergeSpec:
    """A node reached by consumer edges that carry different scale sources."""

    #: scale source id the merged (summed) gradient carries
    out_id: int
    #: one entry per consumer edge into the node: (consumer node, index in its next_functions, scale id)
    edges: list[tuple[Any, int, int]] = field(default_factory=list)


@dataclass
class GraphPlan:
    #: number of scale source ids used (ids are 0 .. n_ids-1)
    n_ids: int
    #: (scaling node, id of the scale arriving at it, id of the scale of its input gradient)
    layers: list[tuple[Any, int, int]]
    merges: list[MergeSpec]
    #: (AccumulateGrad node, its variable, id of the scale its gradient carries)
    leaves: list[tuple[Any, Any, int]]
    #: number of nodes walked
    n_nodes: int


def analyse(root: Any, is_scaling: Callable[[Any], bool]) -> GraphPlan:
    """Walk the graph below ``root`` once and assign scale sources (see module doc).

    For a scaling node only edge 0 (the layer input) carries the layer's new
    scale; its other edges (weight, bias) carry the scale that arrived at it.
    """
    # one pass over the graph, keeping each node's next_functions (reading it builds a tuple each time)
    nodes: list[Any] = [root]
    nexts: list[Any] = [None]
    index: dict[int, int] = {id(root): 0}
    consumers: list[list[tuple[int, int]]] = [[]]
    stack = [0]
    while stack:
        i = stack.pop()
        nf = nodes[i].next_functions
        nexts[i] = nf
        j = 0
        for nxt, _ in nf:
            if nxt is not None:
                key = id(nxt)
                k = index.get(key)
                if k is None:
                    k = len(nodes)
                    index[key] = k
                    nodes.append(nxt)
                    nexts.append(None)
                    consumers.append([(i, j)])
                    stack.append(k)
                else:
                    consumers[k].append((i, j))
            j += 1

    n = len(nodes)
    scaling = [is_scaling(nd) for nd in nodes]
    scale_in: list[int] = [ROOT_SCALE_ID] * n
    out_id: list[int] = [-1] * n
    pending = [len(c) for c in consumers]
    next_id = ROOT_SCALE_ID + 1
    layers: list[tuple[Any, int, int]] = []
    merges: list[MergeSpec] = []
    leaves: list[tuple[Any, Any, int]] = []

    queue = [0]  # Kahn: a node is processed once all its consumers are
    while queue:
        i = queue.pop()
        node = nodes[i]
        if i != 0:
            edges = consumers[i]
            if len(edges) == 1:  # most nodes: one consumer, nothing to merge
                c, j = edges[0]
                scale_in[i] = out_id[c] if (j == 0 and scaling[c]) else scale_in[c]
            else:
                ids = [out_id[c] if (scaling[c] and j == 0) else scale_in[c] for c, j in edges]
                first = ids[0]
                if all(x == first for x in ids):
                    scale_in[i] = first
                else:
                    spec = MergeSpec(next_id, [(nodes[c], j, sid) for (c, j), sid in zip(edges, ids)])
                    next_id += 1
                    merges.append(spec)
                    scale_in[i] = spec.out_id
        if scaling[i]:
            out_id[i] = next_id
            next_id += 1
            layers.append((node, scale_in[i], out_id[i]))
        elif type(node).__name__ == "AccumulateGrad":
            leaves.append((node, node.variable, scale_in[i]))
        for nxt, _ in nexts[i]:
            if nxt is not None:
                k = index[id(nxt)]
                pending[k] -= 1
                if pending[k] == 0:
                    queue.append(k)
    return GraphPlan(n_ids=next_id, layers=layers, merges=merges, leaves=leaves, n_nodes=n)
