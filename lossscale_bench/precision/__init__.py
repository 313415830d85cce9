"""Precisions: what a trial computes in, and the emulation of the low-precision ones in fp32.

* :mod:`.formats`: the number formats (fp16, bf16, E4M3, E5M2, block-scaled, FP4) and their rounding.
* :mod:`.runtime`: :class:`Precision` and :func:`get_precision`, built from a precision table entry
  (:mod:`lossscale_bench.study.precisions`, where ``GRAD_ROUNDINGS`` is defined too).
* :mod:`.layers`: the emulation's hooks on a model (layer outputs, the gradients arriving at them,
  parameter gradients); :mod:`.grad_rounding` rounds a backward's gradients in one call.
* :mod:`.fp4_layers`: the FP4 recipes' split backward (Hadamard wgrad input, NVFP4 weights).
* :mod:`.telemetry`: the per-layer census of flushed, subnormal and saturated gradient elements.

The rounding kernels themselves are :mod:`lossscale_bench.numerics`.
"""

from ..study.precisions import GRAD_ROUNDINGS
from .formats import FORMATS, FP16, FloatFormat
from .layers import EMULATED_LAYERS, EmulationHandle, install_emulation, install_fp16_emulation, round_fp16
from .runtime import Precision, get_precision
from .telemetry import LayerHistory, UnderflowProbe

__all__ = [
    "EMULATED_LAYERS",
    "FORMATS",
    "FP16",
    "GRAD_ROUNDINGS",
    "EmulationHandle",
    "FloatFormat",
    "LayerHistory",
    "Precision",
    "UnderflowProbe",
    "get_precision",
    "install_emulation",
    "install_fp16_emulation",
    "round_fp16",
]
