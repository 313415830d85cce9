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
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .fp4 import uniform

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


def hadamard_round(rows: torch.Tensor, round_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``H^T round_fn(H g)`` over groups of 16 consecutive rows of ``rows`` (``[tokens, channels]``; a
    ragged last group is zero-padded for the transform and the padding dropped).

    ``round_fn`` sees the transformed gradient as a ``[1, channels, 1, padded tokens]`` channels_last
    tensor: its logical order is ``[channels, tokens]``, so its blocks of 16 run along the tokens, as
    NVFP4's columnwise quantisation of the wgrad operand does, and its draws are those of the
    ``[channels, tokens]`` matrix. Why tokens-major (issue 32 item 4): a conv's gradient is channels_last
    and a linear's is ``[tokens, channels]`` already, so neither the transform, the rounding (its C loop
    reads channels_last blocks by columns) nor the inverse copies it into another order; the two
    products are batched ``16x16 @ 16xC`` matrix products, each entry the same 16 terms as the
    channels-major form's (on this machine the same bits, tests/test_precision_fp4.py)."""
    k, c = rows.shape
    pad = -k % SIZE
    x = rows.float()
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    h = H16.to(x.device)
    t = torch.matmul(h, x.reshape(-1, SIZE, c))  # [groups, 16, channels]
    q = round_fn(t.reshape(1, 1, k + pad, c).permute(0, 3, 1, 2))
    back = torch.matmul(h.T, q.permute(0, 2, 3, 1).reshape(-1, SIZE, c))
    return back.reshape(k + pad, c)[:k].to(rows.dtype)
