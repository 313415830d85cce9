"""The decode cache and the four-plane HSV table of the data path: both exist only to be faster,
so each is checked bit for bit against the uncached / 18-plane computation it replaced."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lossscale_bench.data.augment import SSDAugment, hsv_to_rgb
from lossscale_bench.data.transforms import PixelCache, read_image
from lossscale_bench.data.voc import VOCDetection, make_tiny_voc


def _photos(tmp_path):
    rng = np.random.default_rng(0)
    rgb = tmp_path / "rgb.jpg"
    Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(rgb, quality=90)
    gray = tmp_path / "gray.png"
    Image.fromarray(rng.integers(0, 256, (20, 30), dtype=np.uint8), mode="L").save(gray)
    g16 = tmp_path / "g16.png"
    Image.fromarray(rng.integers(0, 65536, (20, 30), dtype=np.uint16).astype(np.int32), mode="I").convert("I;16").save(
        g16
    )
    return [rgb, gray, g16]


def test_a_cached_read_is_the_uncached_read_bit_for_bit_and_a_new_tensor_each_time(tmp_path):
    cache = PixelCache(max_bytes=1 << 30)
    for path in _photos(tmp_path):
        expected = read_image(path)
        first = cache.read(path)
        first.mul_(0)  # a caller writing into its image must not reach the cache
        second = cache.read(path)
        assert second.dtype == expected.dtype == torch.float32
        assert torch.equal(second, expected) and second.stride() == expected.stride(), path.name
    assert len(cache) == 3


def test_the_budget_bounds_what_is_kept(tmp_path):
    paths = _photos(tmp_path)
    off = PixelCache(max_bytes=0)
    assert torch.equal(off.read(paths[0]), read_image(paths[0])) and len(off) == 0
    one = PixelCache(max_bytes=37 * 53 * 3)  # the RGB photo's uint8 bytes, no more
    for p in paths:
        one.read(p)
    assert len(one) == 1 and one.bytes == 37 * 53 * 3


def test_the_environment_sets_the_default_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("LSBENCH_DECODE_CACHE_MB", "0")
    assert PixelCache().max_bytes == 0
    monkeypatch.setenv("LSBENCH_DECODE_CACHE_MB", "2")
    assert PixelCache().max_bytes == 2 << 20


def test_augmented_samples_are_the_same_with_and_without_the_cache(tmp_path, monkeypatch):
    year = tmp_path / "voc"
    make_tiny_voc(year, {"train": 6})
    monkeypatch.setenv("LSBENCH_DECODE_CACHE_MB", "0")
    plain = VOCDetection([(year, "train")], ["square", "disc"], train=True, augment=SSDAugment(out_size=64))
    monkeypatch.delenv("LSBENCH_DECODE_CACHE_MB")
    cached = VOCDetection([(year, "train")], ["square", "disc"], train=True, augment=SSDAugment(out_size=64))
    for rep in range(2):  # the second pass reads from the cache
        for i in range(len(plain)):
            a, ta = plain[(i, 10 * rep + i)]
            b, tb = cached[(i, 10 * rep + i)]
            assert torch.equal(a, b) and torch.equal(ta["boxes"], tb["boxes"])
    assert len(cached._pixels) == len(cached) and len(plain._pixels) == 0


def _hsv_to_rgb_table(img):
    """The textbook table as all 18 planes (the implementation hsv_to_rgb replaced)."""
    h, s, v = img.unbind(0)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.long() % 6
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    table = torch.stack([torch.stack(x) for x in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))])
    return table.gather(0, i.view(1, 1, *i.shape).expand(1, 3, *i.shape)).squeeze(0)


@pytest.mark.parametrize("seed", [0, 1])
def test_hsv_to_rgb_picks_the_tables_planes_bit_for_bit(seed):
    x = torch.rand(3, 61, 47, generator=torch.Generator().manual_seed(seed))
    x[0, 0, :7] = torch.tensor([0.0, 1 / 6, 2 / 6, 0.5, 4 / 6, 5 / 6, 1.0])  # every sextant edge, and h = 1
    got = hsv_to_rgb(x)
    assert torch.equal(got, _hsv_to_rgb_table(x))
    # and it is the colour it should be: pure hues at s = v = 1
    pure = torch.tensor([[0.0, 1 / 3, 2 / 3], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]).view(3, 1, 3)
    assert torch.equal(hsv_to_rgb(pure)[:, 0].T, torch.eye(3))
