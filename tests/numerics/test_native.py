"""The C rounding kernel (numerics/native.py, fp8.NativeKernel): the same bits as torch's cast and the
other implementations, on dense layouts without flattening, checked by its probe before use, built once
per machine, and out of the way whenever it is turned off or cannot be built.

The value tests of test_fp8.py run over every ``impl``, "native" included (ties, subnormals, the
overflow edges, NaN payloads, 1e6 random values); these test what is particular to it."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

from lossscale_bench.numerics import fp8, native
from lossscale_bench.numerics.fp8_formats import E4M3
from lossscale_bench.numerics.lazy_compile import same_values

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"no C kernel here: {native.failure()}")


def _every_fp32_pattern_sample(n=1 << 20, seed=0):
    """Random bit patterns over the whole fp32 range: NaNs with payloads, infs, fp32 subnormals, zeros."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    return bits.view(torch.float32)


@pytest.mark.parametrize("fmt,saturate", [("e4m3", True), ("e4m3", False), ("e5m2", False), ("e5m2", True)])
def test_native_matches_torch_cast_on_random_bit_patterns(fmt, saturate):
    x = _every_fp32_pattern_sample()
    # and the range where the formats live, densely
    x = torch.cat(
        [
            x,
            torch.randn(1 << 18, generator=torch.Generator().manual_seed(1))
            * 2.0 ** torch.randint(-30, 20, (1 << 18,), generator=torch.Generator().manual_seed(2)).float(),
        ]
    )
    assert same_values(fp8.round_fp8(x, fmt, saturate, impl="native"), fp8.round_fp8(x, fmt, saturate, impl="cast"))


def test_a_channels_last_tensor_keeps_its_strides_and_its_values():
    x = torch.randn(2, 8, 5, 7).contiguous(memory_format=torch.channels_last) * 0.01
    y = fp8.round_fp8(x, "e4m3")  # the auto path: the C loop over memory order, no flattening
    assert y.stride() == x.stride()
    assert y.data_ptr() != x.data_ptr()
    assert same_values(y.contiguous(), fp8.round_fp8(x.contiguous(), "e4m3", impl="bits"))


def test_a_tensor_that_is_not_dense_is_flattened_first_and_rounds_the_same():
    base = torch.randn(64, 48) * 0.01
    x = base.t()[::2]  # strided, neither contiguous nor channels_last
    y = fp8.round_fp8(x, "e4m3")
    assert y.shape == x.shape
    assert same_values(y, fp8.round_fp8(x.contiguous(), "e4m3", impl="bits"))


def test_the_input_is_never_written_and_grad_is_not_recorded():
    x = (torch.randn(300) * 1000).requires_grad_()
    before = x.detach().clone()
    y = fp8.round_fp8(x, "e4m3")
    assert torch.equal(x.detach(), before)
    assert not y.requires_grad and y.grad_fn is None


def test_a_kernel_that_fails_its_probe_is_not_used_and_says_why():
    # a real fault: E5M2's significand width handed to the E4M3 kernel rounds differently
    k = fp8.NativeKernel(E4M3, True)
    k._args = (2,) + k._args[1:]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert not k.ready()
    assert "differs from the eager kernel on the probe" in k.broken
    assert any("C rounding kernel for e4m3" in str(m.message) for m in w)
    assert not k.ready()  # checked once


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(native.NO_NATIVE_ENV, "1")
    assert fp8.native_kernel(E4M3, True) is None
    x = torch.randn(1000) * 0.01
    assert same_values(fp8.round_fp8(x, "e4m3"), fp8.round_fp8(x, "e4m3", impl="bits"))
    monkeypatch.delenv(native.NO_NATIVE_ENV)
    monkeypatch.setenv("LSBENCH_NO_COMPILE", "1")
    assert fp8.native_kernel(E4M3, True) is None


def test_large_tensors_go_to_the_parallel_kernel_when_torch_has_several_threads():
    big, small = torch.empty(fp8.NATIVE_SERIAL_MAX + 1), torch.empty(fp8.NATIVE_SERIAL_MAX)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert not fp8.native_fits(big) and fp8.native_fits(small)
        torch.set_num_threads(1)
        assert fp8.native_fits(big)
    finally:
        torch.set_num_threads(threads)


def test_native_refuses_what_it_cannot_round():
    with pytest.raises(ValueError, match="CPU tensors"):
        fp8._round_f32(torch.empty(4, device="meta"), E4M3, True, "native")


def test_built_once_per_cache_and_a_failing_compiler_is_an_error_that_names_it(tmp_path, monkeypatch):
    """On a one-function source folder (the real one takes a minute to build; test_native_cache.py damages
    the cache)."""
    cache, src = tmp_path / "cache", tmp_path / "csrc"
    src.mkdir()
    (src / "one.c").write_text("int lsb_one(void) { return 1; }\n")
    monkeypatch.setenv(native.CACHE_ENV, str(cache))
    cc = native._compiler()
    first = native._build(cc, src)
    stamp = first.stat().st_mtime_ns
    assert native._build(cc, src) == first and first.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in cache.iterdir()) == [first.name, native.record_path(first).name]  # no temporaries
    with pytest.raises(RuntimeError, match="false failed"):
        native._build("/bin/false", src)


def test_no_compiler_means_a_warning_and_the_torch_kernels_with_the_same_values(tmp_path):
    """In a fresh process with no compiler to be found: one warning, and every rounding as before."""
    code = (
        "import warnings, torch\n"
        "from lossscale_bench.numerics import fp8, native\n"
        "x = torch.randn(5000) * 0.01\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    y = fp8.round_fp8(x, 'e4m3')\n"
        "assert native.library() is None and 'no C compiler' in native.failure(), native.failure()\n"
        "assert sum('C rounding kernel is not available' in str(m.message) for m in w) == 1\n"
        "assert torch.equal(y, x.to(torch.float8_e4m3fn).float())\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PATH=str(tmp_path), CC="", **{native.CACHE_ENV: str(tmp_path / "cache")})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_the_census_loop_counts_like_the_eager_expression_and_steps_aside_after_a_failed_probe():
    from lossscale_bench.numerics import census as census_mod

    key = (2.0**-6, 2.0**-10, 448.0)
    x = torch.cat([census_mod._PROBE, torch.randn(5000, generator=torch.Generator().manual_seed(3)) * 1e-2])
    assert census_mod._native_census(x, key).tolist() == census_mod._census(x, *key).tolist()
    # a triple whose probe was recorded as failed goes to the compiled or eager counts
    bad = (2.0**-6, 2.0**-10, 447.0)
    census_mod._NATIVE_OK[bad] = False
    try:
        assert census_mod._native_census(x, bad) is None
        assert census_mod.census(x, *bad).tolist() == census_mod._census(x, *bad).tolist()
    finally:
        del census_mod._NATIVE_OK[bad]


def test_a_cache_folder_that_cannot_be_made_falls_back_to_the_temporary_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv(native.CACHE_ENV, str(blocker / "native"))  # a folder inside a file: mkdir fails
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "one.c").write_text("int lsb_one(void) { return 1; }\n")
    built = native._build(native._compiler(), src)
    assert built.is_file() and built.parent.name == "lossscale_bench_native"
