"""The per-layer rule of adaptive loss scaling: ADAPTIVE.md steps 1-9 and the branch merge target.

Pure tensor functions, no ``nn.Module`` and no autograd: given the gradient arriving at a layer, the layer's
weight and the accumulated scale ``P`` the gradient already carries, :func:`approx_range_scale_tensor` returns the
layer scale ``s`` (:func:`unbounded_scale_tensor`: steps 1-6, the statistics; :func:`bound_scale_tensor`: steps
7-9, the heuristic bounds, power of two and fp16 storage, also in two parts for a backward pass: see below);
:func:`branch_target_scale` is the common scale of merging branches (ADAPTIVE.md "Branches"). Everything returns
0-d fp32 tensors on the gradient's device and never synchronises with the host, so the rule can run inside a
backward pass per layer; :func:`approx_range_scale` is the float convenience form. The layers, hooks and scaler
that apply the rule live in :mod:`.per_layer.iteration` and :mod:`.adaptive`.

Deviations from the Chainer reference in the rule (ADAPTIVE.md's terms; the
others are listed in :mod:`.adaptive`)
------------------------------------------------------------------------------
* ``sigma_g**2 + mu_g**2`` is computed as the mean of squares (the identity
  holds for the population std numpy uses); one reduction instead of two.
* ``2**floor(log2(s))`` is taken with ``frexp`` (exact), because fp32 ``log2``
  rounds values just below a power of two up to it.
* Step 6's ``max(|g_max W_max|, |g_min W_min|, |g_max W_min|, |g_min W_max|)`` is computed as
  ``max|g| * max|W|``: the same fp32 value, because rounding a product is symmetric in sign and
  monotonic in each factor's magnitude, so the largest rounded product is the rounded product of the
  largest magnitudes. Where an inf meets a zero the two forms can differ (NaN or inf), but both are
  non-finite and the scale is 1 either way (the next point). ``max|x|`` is one pass of a C loop on the
  CPU (:func:`lossscale_bench.numerics.amax.max_abs`), where ``torch.aminmax`` took ~1 ms on the
  largest ssd_tiny gradient.
* Non-finite statistics (an inf/NaN gradient) give an unbounded scale of 1
  instead of raising; the non-finite gradient then skips the step as usual and
  does not poison the scale stored for ``update_every`` reuse.
* Branch merge: ``m = max_i(max|g_i| / scale_i)``, the maximum of the *unscaled*
  branch gradients, exactly as the reference (``AdaLossChainer.rescaling`` in
  ``ada_loss/chainer_impl/ada_loss_chainer.py`` divides each branch's max by its
  scale before trying the candidates, largest first). The one difference: if no
  candidate fits even at 1/8 the target is 1/8 and the overflow skips the step,
  where the reference raises ``ValueError``. The target is recomputed at every
  backward pass, as the reference's effectively is (a new ``AdaLossBranch``, with a
  fresh ``AdaLossChainer`` whose counter is 0, is built at each forward).

Output scaling points (``output_scaling``; the authors' later SSD, ``ada_loss_cast``)
------------------------------------------------------------------------------------
:func:`output_scale_tensor` is the reference's ``get_loss_scale_by_approx_range`` with
``W = None`` (``ada_loss/chainer_impl/ada_loss_chainer.py``): statistics of the gradient
alone, no fan-in. Plain: ``s = u_min / (k * std(g))``. Lognormal (class scores): with
``mu, sigma`` of ``log|g|`` over the non-zero entries, ``s = exp(log(u_min) - mu - sigma *
sqrt(2) * erfinv(2T - 1))`` (the T-quantile of a lognormal ``|g|`` moved to ``u_min``). Then
``max(s, 1)``, ``min(s, u_max / max|g|)``; the bounds, power of two and fp16 storage of
:func:`bound_scale_tensor` follow as for layers.

Steps 7-9 in two parts (a backward pass spends a few operations a layer)
------------------------------------------------------------------------
:func:`bound_scale_tensor` is ``R(F(min(u, A / P, U)))``: ``u`` the unbounded scale, ``P`` the scale the arriving
gradient carries, ``A`` = ``accum_upper_bound``, ``U`` = ``scale_upper_bound``, ``F`` the power of two at or below
(:func:`floor_pow2`), ``R`` the fp16 storage: ~19 dispatched operations on 0-d tensors per layer and backward on an
accelerator, although ``u`` changes only when statistics are recomputed. ``F`` and ``R`` are monotone, so they
commute with ``min``: ``R(F(min(u, A / P, U))) == min(R(F(min(u, U))), R(F(A / P)))`` bit for bit, NaN included.
:func:`layer_cap` (the first part) depends on the layer alone, computed once per new ``u``; :func:`headroom`
(``F(A / P)``) on the arriving scale; :func:`bound_from_parts` takes the ``min``. With ``power_of_two`` (the
default: every layer scale ``s`` is then a power of two, 0 or inf) the headroom of the scale a layer sends upstream,
``P * s``, is the arriving headroom divided by ``s`` (:func:`pass_headroom`), bit for bit while ``A / P`` is finite
(``P`` above ``A * 2^-128``); below, the carried headroom is inf where the direct one is a large finite power of two,
which fp16 stores as inf too, so the scales agree unless a layer scale is itself inf (a ``scale_upper_bound`` of
65520 or more). A layer whose statistics are reused costs four operations (two casts, one ``minimum``, one
division); the headroom is computed in full only where a scale starts (the loss) or branches merge.
``tests/scaling/test_adaptive_rule.py`` checks both identities, at the edges too (0, inf, NaN, subnormals, fp16's
overflow).
"""

from __future__ import annotations

import functools
import math

import torch

from ..numerics.amax import max_abs, max_abs_value
from ..precision.formats import FP16, FloatFormat
from .host_fp32 import f32 as _f32
from .host_fp32 import floor_log2 as _floor_log2
from .host_fp32 import fmin as _fmin
from .host_fp32 import recip as _recip

__all__ = [
    "approx_range_scale",
    "approx_range_scale_tensor",
    "unbounded_scale_tensor",
    "bound_scale_tensor",
    "layer_cap",
    "headroom",
    "bound_from_parts",
    "pass_headroom",
    "floor_pow2",
    "branch_target_scale",
    "backward_fan_in",
    "underflow_k",
    "output_scale_tensor",
    "U_MIN",
    "U_MAX",
    "MIN_BRANCH_SCALE",
    "unbounded_scale_host",
    "bound_scale_host",
    "branch_target_scale_host",
    "branch_fallback_scale_host",
]

#: fp16's smallest subnormal, as the reference uses it (the default ``u_min``; other gradient
#: formats bring their own, see ``AdaptiveLossScaler(grad_format=...)``)
U_MIN = FP16.u_min
#: fp16's largest finite value (the default ``u_max``)
U_MAX = FP16.u_max
#: branch merges halve the smallest branch scale down to this
MIN_BRANCH_SCALE = 0.125

_F32 = torch.float32


@functools.cache
def underflow_k(n_uf_threshold: float) -> float:
    """``k = sqrt(2) * erfinv(T)``: with T = 1e-3, k ~= 1.2533e-3."""
    if not 0.0 < n_uf_threshold < 1.0:
        raise ValueError(f"n_uf_threshold must be in (0, 1), got {n_uf_threshold}")
    return math.sqrt(2.0) * float(torch.erfinv(torch.tensor(n_uf_threshold, dtype=torch.float64)))


def backward_fan_in(weight: torch.Tensor) -> int:
    """Fan-in of the backward product: Linear ``out_features``; conv ``out_channels * kh * kw``."""
    if weight.dim() == 2:
        return int(weight.shape[0])
    return int(weight.shape[0] * math.prod(weight.shape[2:]))


def unbounded_scale_tensor(
    grad: torch.Tensor,
    weight: torch.Tensor,
    *,
    n_uf_threshold: float = 1e-3,
    fan_in: int | None = None,
    u_min: float = U_MIN,
    u_max: float = U_MAX,
) -> torch.Tensor:
    """Steps 1-6: the statistical scale before the heuristic bounds, a 0-d fp32 tensor on grad's device.

    ``u_min``/``u_max`` are the gradient format's range (the reference's ``get_range(dtype)``):
    fp16's by default, E5M2's (2**-16, 57344) under ``fp8-emulated``.

    Never synchronises with the host (no ``.item()``, no data-dependent Python branch).
    """
    if fan_in is None:
        fan_in = backward_fan_in(weight)
    g = grad.detach()
    w = weight.detach().to(g.device)
    if g.numel() == 0 or w.numel() == 0:
        return torch.ones((), dtype=_F32, device=g.device)
    # steps 1-2: sigma_o = sqrt((sigma_g^2 + mu_g^2)(sigma_W^2 + mu_W^2)), i.e. sqrt(E[g^2] E[W^2])
    rms_g = torch.linalg.vector_norm(g, dtype=_F32) / math.sqrt(g.numel())
    rms_w = torch.linalg.vector_norm(w, dtype=_F32) / math.sqrt(w.numel())
    sigma_o = rms_g * rms_w * math.sqrt(0.5 * fan_in)  # step 3
    # step 6's operand, the largest |product| of the signed extremes, as max|g| * max|w| (module doc)
    o_max = _max_abs(g) * _max_abs(w)
    # step 5: underflow scale, never below 1
    s = (u_min / (underflow_k(n_uf_threshold) * sigma_o)).clamp(min=1.0)
    # step 6: overflow cap
    s = torch.minimum(s, (u_max / fan_in) / o_max)
    # step 4 (sigma_o == 0 -> 1), and non-finite statistics -> 1 (see module doc)
    ok = (sigma_o > 0) & torch.isfinite(sigma_o) & torch.isfinite(o_max)
    return torch.where(ok, s, torch.ones_like(s))


def output_scale_tensor(
    grad: torch.Tensor,
    *,
    lognormal: bool = False,
    n_uf_threshold: float = 1e-3,
    u_min: float = U_MIN,
    u_max: float = U_MAX,
) -> torch.Tensor:
    """The unbounded scale of an output scaling point (module doc): statistics of ``grad`` alone.

    A 0-d fp32 tensor on grad's device, no host sync. An all-zero gradient, zero spread or
    non-finite statistics give 1 (the reference returns 1 for the first two).
    """
    g = grad.detach()
    if g.numel() == 0:
        return torch.ones((), dtype=_F32, device=g.device)
    g = g.to(_F32)
    if lognormal:
        nz = g != 0
        n = nz.sum().to(_F32)
        logs = torch.where(nz, g.abs().clamp_min(torch.finfo(_F32).tiny).log(), torch.zeros_like(g))
        mu = logs.sum() / n
        sigma = (torch.where(nz, (logs - mu) ** 2, torch.zeros_like(g)).sum() / n).sqrt()
        q = math.sqrt(2.0) * float(torch.erfinv(torch.tensor(2 * n_uf_threshold - 1, dtype=torch.float64)))
        s = torch.exp(math.log(u_min) - mu - sigma * q)
        ok = (n > 0) & (sigma > 0)
    else:
        sigma = g.std(unbiased=False)
        s = u_min / (underflow_k(n_uf_threshold) * sigma)
        ok = sigma > 0
    s = s.clamp(min=1.0)
    o_max = _max_abs(g)
    s = torch.minimum(s, u_max / o_max)
    ok = ok & torch.isfinite(s) & torch.isfinite(o_max) & torch.isfinite(sigma)
    return torch.where(ok, s, torch.ones_like(s))


def _max_abs(t: torch.Tensor) -> torch.Tensor:
    """``max|t|`` as a 0-d fp32 tensor, one pass (:func:`lossscale_bench.numerics.amax.max_abs`: a C loop on
    the CPU, else aminmax; CPU's inf-norm reduction is far slower)."""
    return max_abs(t)


def floor_pow2(s: torch.Tensor) -> torch.Tensor:
    """The power of two at or below each positive finite value of ``s``; other values as they are.

    ``s = m * 2**e`` exactly (``frexp``, ``m`` in [0.5, 1)), so ``s / (2m)`` is ``2**(e-1)`` as a real number and
    as an fp32 one (a correctly rounded quotient of a representable value), subnormals included: the same bits
    as ``ldexp(1, e - 1)`` in 7 operations instead of 12 (``tests/scaling/test_adaptive_rule.py``).
    """
    m, _ = torch.frexp(s)
    return torch.where((s > 0) & (s < math.inf), s / (m + m), s)


def bound_scale_tensor(
    unbounded: torch.Tensor,
    prev_scale: torch.Tensor | float = 1.0,
    *,
    scale_upper_bound: float = 16.0,
    accum_upper_bound: float = 1024.0,
    power_of_two: bool = True,
) -> torch.Tensor:
    """Steps 7-9: heuristic bounds, power of two, fp16 storage. ``prev_scale`` is ``P``."""
    unbounded = unbounded.to(_F32)
    if not isinstance(prev_scale, torch.Tensor):
        prev_scale = torch.full((), float(prev_scale), dtype=_F32, device=unbounded.device)
    s = torch.minimum(unbounded, accum_upper_bound / prev_scale.to(device=unbounded.device, dtype=_F32))
    s = s.clamp(max=scale_upper_bound)
    if power_of_two:
        s = floor_pow2(s)
    return s.to(torch.float16).to(_F32)


def layer_cap(unbounded: torch.Tensor, *, scale_upper_bound: float, power_of_two: bool = True) -> torch.Tensor:
    """``R(F(min(u, U)))``: the layer's part of its bounded scale (0-d fp32, ``unbounded``'s device)."""
    s = unbounded.to(_F32).clamp(max=scale_upper_bound)
    if power_of_two:
        s = floor_pow2(s)
    return s.to(torch.float16).to(_F32)


def headroom(prev_scale: torch.Tensor, *, accum_upper_bound: float, power_of_two: bool = True) -> torch.Tensor:
    """``F(A / P)`` in fp32, ``A / P`` taken as :func:`bound_scale_tensor` takes it."""
    h = accum_upper_bound / prev_scale.to(_F32)
    return floor_pow2(h) if power_of_two else h


def bound_from_parts(cap: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """The bounded layer scale from :func:`layer_cap` and :func:`headroom`: ``min(cap, R(head))``."""
    return torch.minimum(cap, head.to(torch.float16).to(_F32))


def pass_headroom(head: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The headroom of ``P * scale`` from ``P``'s (module doc: exact when ``scale`` is a power of two, 0 or inf)."""
    return head / scale


def approx_range_scale_tensor(
    grad: torch.Tensor,
    weight: torch.Tensor,
    prev_scale: torch.Tensor | float = 1.0,
    *,
    n_uf_threshold: float = 1e-3,
    scale_upper_bound: float = 16.0,
    accum_upper_bound: float = 1024.0,
    power_of_two: bool = True,
    grad_format: FloatFormat = FP16,
) -> torch.Tensor:
    """ADAPTIVE.md steps 1-9 as a 0-d fp32 device tensor (no host sync)."""
    unb = unbounded_scale_tensor(
        grad, weight, n_uf_threshold=n_uf_threshold, u_min=grad_format.u_min, u_max=grad_format.u_max
    )
    return bound_scale_tensor(
        unb,
        prev_scale,
        scale_upper_bound=scale_upper_bound,
        accum_upper_bound=accum_upper_bound,
        power_of_two=power_of_two,
    )


def approx_range_scale(
    grad: torch.Tensor,
    weight: torch.Tensor,
    prev_scale: float = 1.0,
    *,
    n_uf_threshold: float = 1e-3,
    scale_upper_bound: float = 16.0,
    accum_upper_bound: float = 1024.0,
    power_of_two: bool = True,
    grad_format: FloatFormat = FP16,
) -> float:
    """The layer scale of ADAPTIVE.md (steps 1-9) for gradient ``grad`` at a layer with ``weight``.

    ``grad``: Linear ``(N, out)`` (or ``(*, out)``), Conv2d ``(N, Cout, H, W)``;
    ``weight``: ``(out, in)`` or ``(Cout, Cin/groups, kh, kw)``; ``prev_scale``: the
    accumulated scale ``P`` the gradient already carries; ``grad_format``: the format whose
    range the gradient must stay in.
    """
    return float(
        approx_range_scale_tensor(
            grad,
            weight,
            prev_scale,
            n_uf_threshold=n_uf_threshold,
            scale_upper_bound=scale_upper_bound,
            accum_upper_bound=accum_upper_bound,
            power_of_two=power_of_two,
            grad_format=grad_format,
        )
    )


def branch_target_scale(max_abs: torch.Tensor, scales: torch.Tensor, u_max: float = U_MAX) -> torch.Tensor:
    """The common scale ``t`` of merging branches (ADAPTIVE.md "Branches"), on the device.

    ``max_abs[i]`` is ``max|g_i|`` of branch i (scaled, as it arrives), ``scales[i]``
    its scale. ``m = max_i(max_abs[i] / scales[i])``; ``t`` is the largest branch
    scale with ``m*t < U_MAX``, else ``min(scales)`` halved until it fits, not below
    1/8 (where nothing fits the overflow is left to the non-finite check).
    """
    scales = scales.to(_F32)
    m = (max_abs.to(_F32) / scales).amax()
    fits = m * scales < u_max
    best = torch.where(fits, scales, torch.zeros_like(scales)).amax()
    mn = scales.amin()
    # smallest j >= 1 with m * mn * 2^-j < u_max
    j = (torch.floor(torch.log2(mn * m / u_max)) + 1).clamp(min=1.0)
    j = torch.nan_to_num(j, nan=1.0, posinf=1.0)  # j >= 1 or NaN or inf here: 1 where not finite
    halved = (mn * torch.exp2(-j)).clamp(min=MIN_BRANCH_SCALE)  # as maximum(), NaN stays NaN
    fallback = torch.where(mn >= MIN_BRANCH_SCALE, halved, mn)
    return torch.where(fits.any(), best, fallback)


def unbounded_scale_host(
    grad: torch.Tensor,
    weight: torch.Tensor,
    *,
    n_uf_threshold: float = 1e-3,
    fan_in: int | None = None,
    u_min: float = U_MIN,
    u_max: float = U_MAX,
) -> float:
    """:func:`unbounded_scale_tensor` for CPU tensors, its statistics read to the host and the rest computed
    there: the same value, as a Python float.

    Why: after the three reductions the tensor version is ~15 operations on 0-d tensors at
    ~3-8 us of dispatch each, per layer and step (~1.3 ms of an ssd_tiny step); here each is one fp32
    operation on floats (:func:`.host_fp32.f32`), in the tensor version's order, with its hidden steps spelt out:
    ``float / tensor`` is ``tensor.reciprocal() * float`` (``torch/_tensor.py``), a Python constant is
    rounded to fp32 where it meets a tensor, and ``clamp``/``minimum`` keep a NaN
    (tests/scaling/test_adaptive_rule.py compares the two on random and edge values, bit for bit)."""
    if fan_in is None:
        fan_in = backward_fan_in(weight)
    g, w = grad.detach(), weight.detach()
    if g.numel() == 0 or w.numel() == 0:
        return 1.0
    rms_g = _f32(float(torch.linalg.vector_norm(g, dtype=_F32)) / _f32(math.sqrt(g.numel())))
    rms_w = _f32(float(torch.linalg.vector_norm(w, dtype=_F32)) / _f32(math.sqrt(w.numel())))
    sigma_o = _f32(_f32(rms_g * rms_w) * _f32(math.sqrt(0.5 * fan_in)))
    o_max = _f32(max_abs_value(g) * max_abs_value(w))
    if not (sigma_o > 0.0 and math.isfinite(sigma_o) and math.isfinite(o_max)):
        return 1.0
    s = _f32(_recip(_f32(_f32(underflow_k(n_uf_threshold)) * sigma_o)) * _f32(u_min))
    s = max(s, 1.0)  # s is not NaN here: sigma_o is finite and positive
    return _fmin(s, _f32(_recip(o_max) * _f32(u_max / fan_in)))


def bound_scale_host(
    unbounded: float,
    prev_scale: float = 1.0,
    *,
    scale_upper_bound: float = 16.0,
    accum_upper_bound: float = 1024.0,
    power_of_two: bool = True,
) -> float:
    """:func:`bound_scale_tensor` on fp32 values held as floats (:func:`unbounded_scale_host`'s reasons and
    checks): steps 7-9, the same value, the fp16 storage by torch's own conversion."""
    s = _fmin(unbounded, _f32(_recip(prev_scale) * _f32(accum_upper_bound)))
    s = s if s != s else min(s, _f32(scale_upper_bound))
    if power_of_two and s > 0.0 and math.isfinite(s):
        s = math.ldexp(1.0, math.frexp(s)[1] - 1)
    return float(torch.tensor(s, dtype=torch.float16))


def _branch_max(max_abs: list[float], scales: list[float]) -> float | None:
    """``(max_abs / scales).amax()`` in fp32, as :func:`branch_target_scale` takes it: NaN as soon as a quotient
    is NaN (``amax`` propagates it); None for no branches."""
    m = None
    for a, s in zip(max_abs, scales):
        q = _f32(a / s)
        if q != q:
            return q
        m = q if m is None or q > m else m
    return m


def branch_target_scale_host(max_abs: list[float], scales: list[float], u_max: float = U_MAX) -> int | None:
    """:func:`branch_target_scale` on the host: the index of the branch whose scale is ``t``, or None
    where the tensor version must decide (no branch fits, a NaN, a scale that is not positive).

    Why: on the CPU the tensor version is ~15 ops on 0-d tensors at ~3-8 us of dispatch
    each, for a few float operations; the values are fp32 values and every operation here is one fp32
    operation (:func:`.host_fp32.f32`), so where it answers it answers what the tensor version does
    (tests/scaling/test_adaptive_rule.py checks both on random and edge values)."""
    if not all(s > 0.0 for s in scales):
        return None
    m = _branch_max(max_abs, scales)
    if m != m:  # NaN (None, for no branches, compares equal)
        return None
    best = None
    limit = _f32(u_max)  # the tensor version compares in fp32
    for i, s in enumerate(scales):
        if _f32(m * s) < limit and (best is None or s > scales[best]):
            best = i
    return best


def branch_fallback_scale_host(max_abs: list[float], scales: list[float], u_max: float = U_MAX) -> float | None:
    """:func:`branch_target_scale`'s value where no branch scale fits (``min(scales)`` halved until
    ``m * t < u_max``, not below :data:`MIN_BRANCH_SCALE`), on the host; None where torch must decide (a scale
    that is not positive and finite, a halving by more than 2**-100, where ``exp2`` could underflow).

    Why: with E4M3 gradients (u_max 448) no branch fits at about one merge a step of the
    default study's layer-wise dynamic rows, and the tensor version cost ~0.33 ms there. The same fp32
    operations in the same order: ``mn * m / u_max`` (the Python constant rounded to fp32), ``floor(log2)``
    (:func:`.host_fp32.floor_log2`), ``+ 1``, ``clamp(min=1)`` (a value below 1, -inf and a non-finite
    one give 1), ``mn * exp2(-j)``; a NaN ``max|g|`` makes ``m`` NaN, as ``amax`` propagates it."""
    if not scales or not all(s > 0.0 and math.isfinite(s) for s in scales):
        return None
    m = _branch_max(max_abs, scales)
    mn = min(scales)
    if not mn >= MIN_BRANCH_SCALE:
        return mn
    x = _f32(_f32(mn * m) / _f32(u_max))
    j = 1.0
    if x == x and x >= 1.0 and math.isfinite(x):  # below 1 the floor is <= -1, and j clamps to 1
        j = _floor_log2(x) + 1.0
    if j > 100.0:
        return None
    return max(_f32(mn * 2.0**-j), MIN_BRANCH_SCALE)
