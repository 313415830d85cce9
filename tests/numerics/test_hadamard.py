"""The 16x16 Hadamard transform's sums (numerics/hadamard.py): the definition written out element by element in
numpy's float32, the torch code and the C loop (`lsb_hadamard16`) against it, bit for bit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lossscale_bench.numerics import hadamard, native
from lossscale_bench.numerics.hadamard import H16, NativeHadamard, hadamard_round, products
from lossscale_bench.numerics.lazy_compile import same_values

#: a matrix without the random Hadamard transform's sign structure: the C loop's plain path
OTHER = torch.linspace(-1.5, 2.0, 256).reshape(16, 16).contiguous()


def _written_out(h: torch.Tensor, x: torch.Tensor, out_rows: int) -> torch.Tensor:
    """Each output: +0, then + h[i][j] * x[j] for j = 0..15, every product and sum rounded to float32."""
    hn, xn = h.numpy(), x.numpy()
    k, c = xn.shape
    out = np.zeros((out_rows, c), dtype=np.float32)
    with np.errstate(all="ignore"):
        for r in range(out_rows):
            g, i = divmod(r, 16)
            for col in range(c):
                s = np.float32(0.0)
                for j in range(16):
                    v = xn[16 * g + j, col] if 16 * g + j < k else np.float32(0.0)
                    s = np.float32(s + np.float32(hn[i, j] * v))
                out[r, col] = s
    return torch.from_numpy(out)


def _values(k: int, c: int, seed: int, specials: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(k, c, generator=g) * torch.exp2(torch.randint(-130, 120, (k, c), generator=g).float())
    if specials:
        flat = x.view(-1)
        flat[::13], flat[2::17], flat[4::19] = 0.0, -0.0, 3e-42
        flat[6::53], flat[8::59], flat[10::61] = float("inf"), float("-inf"), float("nan")
    return x


@pytest.fixture
def native_ready():
    """Skips where there is no C loop to test (turned off, no compiler); a loop that failed its probe fails."""
    if native.disabled() or native.library() is None:
        pytest.skip(f"no C library here ({native.failure() or 'turned off'})")
    assert hadamard._NATIVE.ready(), hadamard._NATIVE.broken


@pytest.mark.parametrize("k,c", [(32, 16), (40, 6), (21, 19), (16, 1), (48, 33)])
@pytest.mark.parametrize("which", ["H", "H^T", "other"])
def test_both_paths_are_the_sums_written_out(k, c, which, native_ready, monkeypatch):
    h = {"H": H16, "H^T": H16.T.contiguous(), "other": OTHER}[which]
    x = _values(k, c, seed=k * 100 + c)
    x[16:32] = 0.0  # a group of zeros: +0 sums, whatever the sign of the transform's row
    rows = k + -k % 16
    want = _written_out(h, x, rows)
    assert same_values(hadamard._products_torch(h, x, rows), want)
    assert same_values(products(h, x, rows), want)
    # the inverse's shape: a padded input, the first k rows out
    padded = F.pad(x, (0, 0, 0, rows - k))
    assert same_values(products(h, padded, k), want[:k])


def test_the_order_of_the_sums_is_visible_to_these_values():
    # the reverse order gives other bits on these values (so the tests above would see an order change)
    x = _values(32, 16, seed=5, specials=False)
    rev = _written_out(H16.flip(1), x.flip(0).contiguous(), 32)
    assert not same_values(rev, _written_out(H16, x, 32))


@pytest.mark.parametrize("k,c", [(73728 // 8, 16), (4608, 32), (288, 24), (72, 64), (37, 40), (1000, 7)])
def test_the_c_loop_matches_the_torch_code_on_model_shapes(k, c, native_ready, monkeypatch):
    x = _values(k, c, seed=c)
    rows = k + -k % 16
    for h in (H16, H16.T.contiguous(), OTHER):
        assert same_values(products(h, x, rows), hadamard._products_torch(h, x, rows))
    monkeypatch.setattr(hadamard, "_products_torch", lambda *a: pytest.fail("the torch code ran, not the C loop"))
    products(H16, x, rows)


def test_turned_off_by_the_environment_gives_the_torch_code(monkeypatch):
    monkeypatch.setenv(native.NO_NATIVE_ENV, "1")
    monkeypatch.setattr(NativeHadamard, "__call__", lambda *a: pytest.fail("the C loop ran while turned off"))
    x = _values(40, 6, seed=1)
    assert same_values(products(H16, x, 48), _written_out(H16, x, 48))


def test_a_loop_that_fails_its_probe_is_not_used_and_says_why():
    # a real fault: the transform's rows handed to the C loop in reverse order
    class Reversed(NativeHadamard):
        def __call__(self, h, x, out_rows):
            return super().__call__(h.flip(0).contiguous(), x, out_rows)

    k = Reversed()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert not k.ready()
    assert "differs from the eager kernel on the probe" in k.broken
    assert any("16x16 Hadamard transform" in str(m.message) for m in w)


def test_hadamard_round_inverts_the_transform_up_to_the_rounding():
    # integers: every sum exact, so H^T (H g) is g itself; a ragged token count
    g = torch.randint(-64, 65, (72, 24)).float()
    assert torch.equal(hadamard_round(g, lambda t: t), g)
    seen = []
    hadamard_round(g, lambda t: seen.append((t.shape, t.is_contiguous(memory_format=torch.channels_last))) or t)
    assert seen == [(torch.Size([1, 24, 1, 80]), True)]
