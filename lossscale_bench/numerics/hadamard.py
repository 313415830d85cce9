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


def hadamard_round(g2: torch.Tensor, round_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``H^T round_fn(H g)`` along dimension 1 of the 2-D ``g2`` (``[channels, tokens]``), in groups
    of 16 tokens (a ragged last group is zero-padded for the transform and the padding dropped).
    ``round_fn`` sees the transformed ``[channels, padded tokens]`` tensor, so its blocks of 16 run
    along the tokens, as NVFP4's columnwise quantisation of the wgrad operand does."""
    c, k = g2.shape
    pad = -k % SIZE
    x = F.pad(g2.float(), (0, pad)) if pad else g2.float()
    h = H16.to(x.device)
    t = (x.reshape(c, -1, SIZE) @ h.T).reshape(c, k + pad)
    back = (round_fn(t).reshape(c, -1, SIZE) @ h).reshape(c, k + pad)
    return back[:, :k].to(g2.dtype)
