"""The 16x16 random Hadamard transform NVIDIA's NVFP4 recipe applies before quantising the inputs
of the weight-gradient product (arXiv 2509.25149, section 4.2; Transformer Engine's RHT).

Why it helps: a weight gradient sums products over the tokens (for a convolution: over batch and
positions). Rotating each group of 16 consecutive tokens by an orthogonal matrix ``H`` leaves the
sum unchanged (``(Hg)^T (Hx) = g^T x``) but spreads an outlier over 16 values, so a block scale
set by one large gradient no longer flushes its 15 small neighbours. ``H = D W / 4``: ``W`` the
16x16 Sylvester-Hadamard matrix, ``D`` a fixed diagonal of random signs (NVIDIA also fixes one
sign vector; ours comes from :func:`fp4.uniform` with key 16, so it is the same in every run).

The emulation applies it to the gradient only: the weight gradient is computed from
``H^T Q(H g)`` (:func:`hadamard_round`) and the layer input as it is, which is exactly
``Q(Hg)^T (Hx)`` with ``Hx`` left unquantised (the input already holds its forward format).

**The sums, defined**: each transformed value is the sum of the 16 fp32 products
``h[i][j] * x[j]``, added in the order ``j = 0..15`` to a +0, each addition rounded (:func:`products`).
A matrix product leaves its order to the BLAS: on the CPU measured MKL summed in that order for 8 or more
columns but not for 5-7 (docs/records/index.md, "The Hadamard transform in C"), and cuBLAS has its own. Written out, the
transform gives the same values on any device and BLAS. On the CPU a C loop computes it
(``lsb_hadamard16``, :mod:`.native`, checked against the torch code on probe values before use) at ~3x
a 1-thread MKL product's speed: the transform's sign structure turns its 16 products a value into one
multiply a row and additions. The torch code, a multiply and an addition a term over the whole tensor, is
~6x slower than that product on the CPU (where no C loop runs: no compiler, ``LSBENCH_NO_NATIVE=1``);
``benchmarks/hadamard_speed.py`` and docs/records/index.md, "The Hadamard transform in C".
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .fp4 import uniform
from .lazy_compile import same_values
from .native import ProbeChecked
from .native import disabled as native_disabled

SIZE = 16


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _matrix() -> torch.Tensor:
    signs = torch.where(uniform(SIZE, torch.tensor(SIZE, dtype=torch.int64)) < 0.5, -1.0, 1.0)
    return signs.unsqueeze(1) * _sylvester(SIZE) / 4.0  # entries +-1/4: orthogonal, exact in fp32


#: the transform (rows: D W / 4), orthogonal: ``H @ H.T`` is the identity up to fp32 rounding (exactly)
H16 = _matrix()
#: its inverse, stored contiguous (the C loop reads it row by row; made once, not at every call)
H16_T = H16.T.contiguous()


def _products_torch(h: torch.Tensor, x: torch.Tensor, out_rows: int) -> torch.Tensor:
    """:func:`products` in torch ops: one product and one rounded addition per ``j`` (eager torch never
    fuses a multiply into an addition)."""
    k, c = x.shape
    pad = -k % SIZE
    x3 = (F.pad(x, (0, 0, 0, pad)) if pad else x).reshape(-1, SIZE, c)
    acc = torch.zeros_like(x3)
    for j in range(SIZE):
        acc += h[:, j].view(1, SIZE, 1) * x3[:, j : j + 1, :]
    return acc.reshape(-1, c)[:out_rows]


class NativeHadamard(ProbeChecked):
    """``lsb_hadamard16``, used once it matched :func:`_products_torch` bit for bit on :func:`_probe` (both
    transforms, ragged groups and columns, a matrix without the fast path's structure)."""

    function = "lsb_hadamard16"

    def describe(self) -> str:
        return "16x16 Hadamard transform"

    def matches_probe(self) -> bool:
        x = _probe()
        other = torch.arange(256, dtype=torch.float32).reshape(16, 16).sin()  # no sign structure: the plain loop
        for h in (H16, H16_T, other):
            for k, c in ((48, 16), (40, 6), (37, 40), (16, 1)):
                xs = x[: k * c].reshape(k, c).clone()
                xs[16:32] = 0.0  # a group of zeros: sums of +0, whatever the row's sign
                rows = k + -k % SIZE
                if not same_values(self(h, xs, rows), _products_torch(h, xs, rows)):
                    return False
                padded = F.pad(xs, (0, 0, 0, rows - k)).contiguous()
                if not same_values(self(h, padded, k), _products_torch(h, padded, k)):  # the inverse's shape
                    return False
        return True

    def __call__(self, h: torch.Tensor, x: torch.Tensor, out_rows: int) -> torch.Tensor:
        """``x``: fp32, CPU, contiguous ``[rows, c]``; ``h`` fp32 contiguous 16x16."""
        out = torch.empty(out_rows, x.shape[1])
        self._fn(x.data_ptr(), out.data_ptr(), x.shape[0], out_rows, x.shape[1], h.data_ptr())
        return out


def _probe() -> torch.Tensor:
    """1,480 values: normal ones over fp32's whole range, zeros of both signs, subnormals, infinities and
    NaNs at irregular places (deterministic)."""
    g = torch.Generator().manual_seed(32)
    x = torch.randn(1480, generator=g) * torch.exp2(torch.randint(-140, 128, (1480,), generator=g).float())
    x[::17], x[3::19], x[5::23] = 0.0, -0.0, 1e-44
    x[7::61], x[11::67], x[13::71] = float("inf"), float("-inf"), float("nan")
    return x


_NATIVE = NativeHadamard()


def products(h: torch.Tensor, x: torch.Tensor, out_rows: int) -> torch.Tensor:
    """``h`` applied to each group of 16 consecutive rows of ``x`` (``[rows, c]``; a ragged last group
    zero-padded), the first ``out_rows`` rows of the result: each value the sum of ``h[i][j] * x[j]`` in the
    order ``j = 0..15`` from +0 (module doc). The C loop where it runs, the same values."""
    x = x.float().contiguous()
    h = h.to(x.device).contiguous()
    if x.device.type == "cpu" and not native_disabled() and _NATIVE.ready():
        return _NATIVE(h, x, out_rows)
    return _products_torch(h, x, out_rows)


def hadamard_round(rows: torch.Tensor, round_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``H^T round_fn(H g)`` over groups of 16 consecutive rows of ``rows`` (``[tokens, channels]``; a
    ragged last group is zero-padded for the transform and the padding dropped).

    ``round_fn`` sees the transformed gradient as a ``[1, channels, 1, padded tokens]`` channels_last
    tensor: its logical order is ``[channels, tokens]``, so its blocks of 16 run along the tokens, as
    NVFP4's columnwise quantisation of the wgrad operand does, and its draws are those of the
    ``[channels, tokens]`` matrix. Why tokens-major: a conv's gradient is channels_last
    and a linear's is ``[tokens, channels]`` already, so neither the transform, the rounding (its C loop
    reads channels_last blocks by columns) nor the inverse copies it into another order."""
    k, c = rows.shape
    padded = k + -k % SIZE
    t = products(H16, rows, padded)
    q = round_fn(t.reshape(1, 1, padded, c).permute(0, 3, 1, 2))
    return products(H16_T, q.permute(0, 2, 3, 1).reshape(padded, c), k).to(rows.dtype)
