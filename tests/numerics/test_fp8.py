"""E4M3/E5M2 round trips: bit-identical to torch's cast on every edge case, in every implementation.

References: torch's own CPU cast (``x.to(float8).float()``) and, where torch has no such mode
(non-saturating E4M3, saturating E5M2), the rule written out here plainly. Values are compared as
int32 bit patterns, so -0.0 vs 0.0 and NaN payloads count.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

from lossscale_bench.numerics import lazy_compile
from lossscale_bench.numerics.fp8 import IMPLS, compiled_kernel, round_e4m3, round_e5m2, round_fp8
from lossscale_bench.numerics.fp8_formats import E4M3, E5M2
from lossscale_bench.numerics.lazy_compile import LazyCompiled


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().view(torch.int32)


def nextafter(v: float, direction: float) -> float:
    return torch.nextafter(torch.tensor(v), torch.tensor(direction)).item()


def from_bits(*patterns: int) -> torch.Tensor:
    return torch.tensor([p - 2**32 if p >= 2**31 else p for p in patterns], dtype=torch.int32).view(torch.float32)


def edge_values(dtype: torch.dtype) -> torch.Tensor:
    """Every code of the format, the midpoints between neighbours (ties) and the fp32 numbers
    just either side of them, fp32 subnormals, zeros, inf, NaN payloads, huge values."""
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    codes = codes[torch.isfinite(codes)].unique()  # sorted, one zero
    mids = (codes[1:] + codes[:-1]) / 2  # exact in fp32
    near = torch.cat([torch.nextafter(mids, torch.tensor(math.inf)), torch.nextafter(mids, torch.tensor(-math.inf))])
    fmax = torch.finfo(dtype).max
    top = [
        fmax,
        fmax * 1.03125,
        fmax * 1.0625,
        fmax * 1.07,
        fmax * 1.1,
        fmax * 1.125,
        fmax * 1.2,
        1e6,
        1e38,
        3.4028234663852886e38,
    ]
    mid = fmax + 2.0 ** (math.floor(math.log2(fmax)) - (3 if dtype == torch.float8_e4m3fn else 2) - 1)
    top += [mid, 2 * mid - fmax]  # the overflow tie (464, 61440) and the first code past max
    top += [nextafter(v, d) for v in top[:3] + [mid] for d in (math.inf, -math.inf)]
    sub = [2.0**-149, 3 * 2.0**-149, 2.0**-140, 2.0**-127, 2.0**-126 - 2.0**-149, 2.0**-126]
    pos = torch.cat([codes, mids, near, torch.tensor(top + sub)])
    special = torch.cat(
        [
            torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan]),
            from_bits(0x7F800001, 0x7FFFFFFF, 0xFFC00000, 0xFF800001),
        ]
    )
    return torch.cat([pos, -pos, special])


def random_values(n: int = 1_000_000, seed: int = 0) -> torch.Tensor:
    """Random signs and significands over magnitudes 2^-30 .. 2^20."""
    g = torch.Generator().manual_seed(seed)
    mant = torch.rand(n, generator=g) + 1.0
    exp = torch.randint(-30, 21, (n,), generator=g).float()
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    return sign * mant * torch.exp2(exp)


@pytest.fixture(scope="module")
def e4m3_values():
    return torch.cat([edge_values(torch.float8_e4m3fn), random_values()])


@pytest.fixture(scope="module")
def e5m2_values():
    return torch.cat([edge_values(torch.float8_e5m2), random_values(seed=1)])


@pytest.mark.parametrize("impl", IMPLS)
def test_e4m3_saturating_is_torch_cast_bit_for_bit(impl, e4m3_values):
    x = e4m3_values
    assert torch.equal(bits(round_e4m3(x, True, impl)), bits(x.to(torch.float8_e4m3fn).float()))


@pytest.mark.parametrize("impl", IMPLS)
def test_e5m2_is_torch_cast_bit_for_bit(impl, e5m2_values):
    x = e5m2_values
    assert torch.equal(bits(round_e5m2(x, False, impl)), bits(x.to(torch.float8_e5m2).float()))


def test_e4m3_hand_computed_points():
    """Round-to-nearest-even at quanta worked out by hand (E4M3: 3 significand bits, subnormal
    quantum 2^-9, max 448)."""
    q = 2.0**-9
    cases = {
        0.5 * q: 0.0,  # tie between 0 and q: even is 0
        0.5 * q * 1.0001: q,  # just above the tie
        1.5 * q: 2 * q,  # tie between q (odd) and 2q (even)
        2.5 * q: 2 * q,  # tie between 2q (even) and 3q
        17.0: 16.0,  # quantum 2 in [16, 32): tie 16 (1.000) vs 18 (1.001)
        19.0: 20.0,  # tie 18 (1.001) vs 20 (1.010)
        0.3: 0.3125,  # 0.3 = 1.2 * 2^-2, quantum 2^-5: nearest 10 * 2^-5
        240.0: 240.0,
        1000.0: 448.0,  # saturates
        2.0**-6 - 2.0**-20: 2.0**-6,  # top of the subnormal range rounds up to min normal
    }
    x = torch.tensor(list(cases))
    for impl in IMPLS:
        assert round_e4m3(x, True, impl).tolist() == list(cases.values()), impl
        assert round_e4m3(-x, True, impl).tolist() == [-v for v in cases.values()], impl


def test_signed_zeros_and_flushed_negatives_keep_their_sign():
    x = torch.tensor([0.0, -0.0, -1e-45, -(2.0**-20), 1e-45])  # -2^-20 flushes in both
    for impl in IMPLS:
        assert bits(round_e4m3(x, True, impl)).tolist() == [0, -(2**31), -(2**31), -(2**31), 0], impl
        assert bits(round_e5m2(x, False, impl)).tolist() == [0, -(2**31), -(2**31), -(2**31), 0], impl


def non_saturating_rule(x: torch.Tensor) -> torch.Tensor:
    """OCP non-saturating E4M3 written plainly: 464 is the tie between 448 (significand 110,
    even) and the NaN code 480 (111), so it rounds down; above it, and at +-inf: NaN."""
    y = x.to(torch.float8_e4m3fn).float()
    return torch.where(x.abs() > 464.0, torch.full_like(y, math.nan), y)


@pytest.mark.parametrize("impl", IMPLS)
def test_e4m3_non_saturating_gives_nan_past_464(impl, e4m3_values):
    x = e4m3_values
    got, want = round_e4m3(x, False, impl), non_saturating_rule(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(bits(got[ok]), bits(want[ok]))
    edge = torch.tensor([448.0, 463.99997, 464.0, 464.00003, 480.0, math.inf, -math.inf, -500.0])
    out = round_e4m3(edge, False, impl)
    assert out[:3].tolist() == [448.0, 448.0, 448.0]
    assert torch.isnan(out[3:]).all()
    assert torch.signbit(out[-1]) and not torch.signbit(out[3])  # NaN keeps the input's sign


def test_all_implementations_agree_bit_for_bit_including_nan_patterns(e4m3_values, e5m2_values):
    for fmt, x in (("e4m3", e4m3_values), ("e5m2", e5m2_values)):
        for sat in (True, False):
            ref = bits(round_fp8(x, fmt, sat, "cast"))
            for impl in IMPLS:
                assert torch.equal(bits(round_fp8(x, fmt, sat, impl)), ref), (fmt, sat, impl)


def test_e5m2_saturating_clamps_overflow_and_inf():
    x = torch.tensor([57344.0, 61439.996, 61440.0, 1e6, math.inf, -math.inf, math.nan, 1.0])
    for impl in IMPLS:
        y = round_e5m2(x, True, impl)
        assert y[:6].tolist() == [57344.0] * 5 + [-57344.0], impl
        assert math.isnan(y[6]) and y[7] == 1.0
    assert math.isinf(round_e5m2(torch.tensor([61440.0]))[0])  # torch's default: inf


def test_nan_and_inf_bit_patterns_match_torch():
    x = from_bits(0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F800000, 0xFF800000)
    for impl in IMPLS:
        assert bits(round_e4m3(x, True, impl)).tolist() == bits(x.to(torch.float8_e4m3fn).float()).tolist()
        assert bits(round_e5m2(x, False, impl)).tolist() == bits(x.to(torch.float8_e5m2).float()).tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_input_dtypes_round_like_a_direct_cast(dtype):
    x = random_values(100_000, seed=2).to(dtype)
    x = torch.cat([x, torch.tensor([500.0, -0.0, math.inf, math.nan], dtype=dtype)])
    for fmt, fdt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        for impl in IMPLS:
            y = round_fp8(x, fmt, impl=impl)
            assert y.dtype == dtype
            ref = x.to(fdt).to(dtype)
            assert torch.equal(torch.isnan(y), torch.isnan(ref))
            ok = ~torch.isnan(ref)
            assert torch.equal(y[ok].view(torch.uint8), ref[ok].view(torch.uint8)), (dtype, fmt, impl)


def test_shapes_strides_and_the_input_is_untouched():
    x = random_values(6 * 7, seed=3).reshape(6, 7).t()  # non-contiguous
    keep = x.clone()
    for impl in IMPLS:
        y = round_e4m3(x, impl=impl)
        assert y.shape == (7, 6)
        assert torch.equal(bits(y), bits(x.contiguous().to(torch.float8_e4m3fn).float()))
        assert torch.equal(bits(x), bits(keep))
        assert round_e4m3(torch.empty(0, 3), impl=impl).shape == (0, 3)
        assert round_e4m3(torch.tensor(500.0), impl=impl).item() == 448.0
    w = torch.randn(4, requires_grad=True)
    assert not round_e4m3(w * 2).requires_grad


def compiled_or_skip(k: LazyCompiled) -> None:
    if lazy_compile.compile_disabled():
        pytest.skip("LSBENCH_NO_COMPILE is set")
    if k.broken:
        pytest.skip(f"torch.compile is unavailable here: {k.broken}")


def test_one_compiled_graph_serves_twenty_shapes():
    k = compiled_kernel("bits", E4M3, True)
    shapes = [
        (1,),
        (2,),
        (3,),
        (31,),
        (32,),
        (33,),
        (1000,),
        (4, 5),
        (3, 3, 3, 3),
        (64, 3, 3, 3),
        (2, 16, 32, 32),
        (7, 1),
        (1, 9),
        (128,),
        (129,),
        (10000,),
        (2, 3, 5, 7),
        (17, 19),
        (256, 256),
        (5,),
    ]
    for i, shape in enumerate(shapes):
        x = random_values(math.prod(shape), seed=10 + i).reshape(shape)
        assert torch.equal(bits(round_e4m3(x)), bits(x.to(torch.float8_e4m3fn).float())), shape
    compiled_or_skip(k)
    assert k.graphs == 1


def test_no_compile_env_runs_eager_with_the_same_result(monkeypatch):
    x = random_values(10_000, seed=4)
    k = compiled_kernel("bits", E4M3, False)
    monkeypatch.setenv("LSBENCH_NO_COMPILE", "1")
    assert not k.uses_compiled()
    graphs = k.graphs
    eager = round_e4m3(x, False)
    assert k.graphs == graphs
    monkeypatch.delenv("LSBENCH_NO_COMPILE")
    assert torch.equal(bits(round_e4m3(x, False)), bits(eager))


def test_a_failing_compiler_falls_back_to_eager_once(monkeypatch):
    def broken_compile(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no C++ compiler\nsecond line")

        return run

    monkeypatch.delenv("LSBENCH_NO_COMPILE", raising=False)
    monkeypatch.setattr(torch, "compile", broken_compile)
    k = LazyCompiled(lambda x: x * 2 + 1, "test_fallback")
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        assert k(torch.ones(3)).tolist() == [3.0, 3.0, 3.0]
    assert k.broken == "RuntimeError: no C++ compiler"
    assert not k.uses_compiled()
    assert k(torch.ones(2)).tolist() == [3.0, 3.0]


def test_an_input_error_is_raised_not_swallowed(monkeypatch):
    def fn(x):
        raise ValueError("bad input")

    monkeypatch.setattr(torch, "compile", lambda f, **kw: f)
    k = LazyCompiled(fn, "test_error")
    with pytest.raises(ValueError, match="bad input"):
        k(torch.ones(3))
    assert k.broken is None


def test_concurrent_first_calls_compile_once_and_agree():
    k = LazyCompiled(lambda x: (x * 3 - 1).abs(), "test_threads")
    xs = [torch.randn(100 + i) for i in range(4)]
    out: list = [None] * 4

    def work(i):
        out[i] = k(xs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, y in zip(xs, out):
        assert torch.equal(y, (x * 3 - 1).abs())
    compiled_or_skip(k)
    assert k.graphs == 1


def test_format_facts():
    assert E4M3.overflow_midpoint == 464.0 and E5M2.overflow_midpoint == 61440.0
    assert E4M3.min_subnormal == 2.0**-9 and E5M2.min_subnormal == 2.0**-16
    for spec in (E4M3, E5M2):
        fi = torch.finfo(spec.dtype)
        assert spec.max == fi.max and 2.0**spec.emin == fi.smallest_normal
    with pytest.raises(ValueError):
        round_fp8(torch.ones(2), "e4m3", impl="fast")
    with pytest.raises(TypeError):
        round_fp8(torch.ones(2, dtype=torch.int32), "e4m3")


class _RoundThrough(torch.autograd.Function):
    """How the emulation uses the kernels: forward values and incoming gradients rounded."""

    @staticmethod
    def forward(ctx, x, fn):
        ctx.fn = fn
        return fn(x)

    @staticmethod
    def backward(ctx, g):
        return ctx.fn(g), None


def test_usable_inside_autograd_functions_and_hooks():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 9, 9)

    def run(fn):
        conv.zero_grad()
        out = _RoundThrough.apply(conv(x), fn)
        hook = conv.weight.register_hook(fn)
        (out * 1000).square().sum().backward()
        hook.remove()
        return out.detach(), conv.weight.grad.clone()

    ours = run(round_e4m3)
    ref = run(lambda t: t.to(torch.float8_e4m3fn).to(t.dtype))
    for a, b in zip(ours, ref):
        assert torch.equal(bits(a), bits(b))


def test_a_compiled_kernel_that_rounds_differently_is_not_used(monkeypatch):
    """The probe: generated code that silently differs from eager (here: a 'compiler' that
    drops the rounding, as Inductor does with fp32 -> fp16 -> fp32) is caught before use."""
    monkeypatch.delenv("LSBENCH_NO_COMPILE", raising=False)
    monkeypatch.setattr(torch, "compile", lambda f, **kw: lambda x: x.clone())
    probe = torch.tensor([1.0, 0.3, 500.0])
    k = LazyCompiled(lambda x: x.half().float(), "test_probe", probe=(probe,))
    with pytest.warns(RuntimeWarning, match="differs from the eager kernel"):
        out = k(torch.tensor([0.1, 0.2]))
    assert torch.equal(out, torch.tensor([0.1, 0.2]).half().float())
    assert not k.uses_compiled()


def test_channels_last_tensors_keep_their_layout_and_values():
    """The CPU backend runs models channels_last: a rounding that handed back NCHW tensors made every
    later op convert layouts (measured: E4M3 steps 2.1x fp32 before, 1.25x after; docs/records/index.md)."""
    import torch

    from lossscale_bench.numerics.block_scaling import block_round
    from lossscale_bench.numerics.fp8 import round_e4m3, round_e5m2

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 5, 6, 7, generator=g) * 300).to(memory_format=torch.channels_last)
    assert not x.is_contiguous()
    for fn, dtype in ((round_e4m3, torch.float8_e4m3fn), (round_e5m2, torch.float8_e5m2)):
        y = fn(x)
        assert y.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(y, x.to(dtype).float())  # torch's cast, element for element
        assert torch.equal(fn(x.contiguous()), y) and fn(x.contiguous()).is_contiguous()
    b = block_round(x, "e4m3", "mx32")
    assert b.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(b, block_round(x.contiguous(), "e4m3", "mx32"))  # blocks in logical order, as before


def test_saturating_e4m3_does_not_depend_on_torchs_cast(monkeypatch):
    """torch 2.11.0's float8_e4m3fn cast gives NaN past 464 (on the CPU and on CUDA; torch 2.14.1's
    CPU cast saturates): with such a cast stood in, every implementation must still saturate."""
    from lossscale_bench.numerics import fp8

    def nonsaturating_cast(x, dtype):
        y = x.to(dtype)
        if dtype == torch.float8_e4m3fn:
            nan = torch.full_like(x, math.nan).to(dtype)
            y = torch.where((x.abs() > 464).to(torch.bool), nan, y)
        return y

    monkeypatch.setattr(fp8, "_torch_cast", nonsaturating_cast)
    monkeypatch.setenv("LSBENCH_NO_COMPILE", "1")  # the eager cast, which reads the patched function
    x = torch.tensor([448.0, 464.0, 464.00003, 500.0, 1e6, math.inf, -math.inf, -1e6, 1.0])
    want = [448.0, 448.0, 448.0, 448.0, 448.0, 448.0, -448.0, -448.0, 1.0]
    assert fp8._cast_eager(x, E4M3, True).tolist() == want
    assert nonsaturating_cast(x, torch.float8_e4m3fn).float().isnan().any()  # the stand-in is what it claims
