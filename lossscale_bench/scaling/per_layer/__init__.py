"""The machinery every per-layer loss scaler shares: a scale per Conv2d/Linear on an unmodified model.

* :mod:`.scaler`: :class:`PerLayerLossScaler` and :class:`PointLossScaler`, the bases a per-layer
  method subclasses to write its rule (adaptive, layer-wise dynamic, amax: one module each in
  :mod:`lossscale_bench.scaling`).
* :mod:`.graph`: one walk over a backward's autograd graph before it runs (scale sources, merge points).
* :mod:`.functions`: the layers' autograd Functions and patched forwards.
* :mod:`.iteration`: the state of one backward pass, hung on the graph (merges, conversions).
"""

from .scaler import LOSS_POINT, PerLayerLossScaler, PointLossScaler

__all__ = ["LOSS_POINT", "PerLayerLossScaler", "PointLossScaler"]
