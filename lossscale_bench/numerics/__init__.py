"""Numerics the FP8/MX/FP4 emulation needs: exact fp8 round trips and block-scaled gradient formats.

* :mod:`.fp8`: E4M3/E5M2 round trips bit-identical to torch's cast, fast on CPU (compiled by
  Inductor on first use, eager fallback; ``LSBENCH_NO_COMPILE=1`` forces eager); the formats
  themselves in :mod:`.fp8_formats`, memory-order flattening in :mod:`.layout`.
* :mod:`.block_scaling`: per-tensor, 1x128-tile and MX-32 block-scaled round trips;
  :mod:`.block_scales`: their scales; :mod:`.flush_counts`: the flush/saturation counts the telemetry needs.
* :mod:`.fp4`: E2M1 alone, NVFP4 and MXFP4 round trips, to nearest or stochastic (seeded,
  reproducible), compiled the same way; :mod:`.hadamard`: the 16x16 random Hadamard transform.
* :mod:`.census` and :mod:`.amax`: the telemetry's element counts and a gradient's ``max |x|``.
* :mod:`.native`: the CPU's fastest path for all of these, small C loops built once per machine and
  checked bit for bit against the torch kernels before use (``LSBENCH_NO_NATIVE=1`` turns them off).

torchao is not needed; the tests compare against it when it is installed.
"""

from .block_scales import MX_MODES, amax_scale, mx_exponent
from .block_scaling import GRANULARITIES, block_round
from .flush_counts import FlushSaturate, count_flush_saturate
from .fp8 import round_e4m3, round_e5m2, round_fp8
from .fp8_formats import E4M3, E5M2, Fp8Spec

__all__ = [
    "E4M3",
    "E5M2",
    "GRANULARITIES",
    "MX_MODES",
    "FlushSaturate",
    "Fp8Spec",
    "amax_scale",
    "block_round",
    "count_flush_saturate",
    "mx_exponent",
    "round_e4m3",
    "round_e5m2",
    "round_fp8",
]
