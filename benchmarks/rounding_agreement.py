"""Does the emulation round the same on CPU and on CUDA?

    PYTHONPATH=. python benchmarks/rounding_agreement.py --out runs/rounding   # on a CUDA machine
    .venv/bin/python benchmarks/rounding_agreement.py --cpu-only               # CPU side only (tests)

Why: a study's E4M3 rows are emulated, so a result measured on a laptop and one measured on a GPU
node are only comparable if every emulated format gives the same bits on both devices. Two kinds
of path are checked on one fixed tensor (random magnitudes from 2^-30 to 2^20 plus every edge:
+-0, +-inf, NaN, each format's max, overflow midpoints, subnormal boundaries and ties):

* the emulation's own roundings (``FloatFormat.round`` of every format in ``formats.FORMATS``, the
  E4M3/E5M2 kernels in each implementation, the block-scaled formats), which lsbench uses;
* torch's raw casts (``x.to(dtype).to(float32)``), which lsbench does *not* use for E4M3 and whose
  overflow behaviour (saturate to +-448 vs NaN) may differ between devices.

Results compare bit patterns (all NaNs count as equal: payloads are not data); each row says how
many elements differ and shows a few. Writes ``OUT/rounding_agreement.{json,md}`` and prints the
markdown. With ``--cpu-only`` the CPU side is computed and compared with itself (a smoke run).
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from harness import markdown_table, parser  # noqa: E402  (it puts the repository on the path too)


def edge_values() -> list[float]:
    """Values where roundings disagree if they disagree anywhere: each format's limits and the
    midpoints between its largest values, its subnormal steps and their halves, and specials."""
    vals = [0.0, float("inf"), float("nan"), 1.0, 1.5, 1.0625, 1.125, 1.1875]
    for fmax, step in ((448.0, 32.0), (57344.0, 8192.0), (65504.0, 32.0)):
        vals += [
            fmax,
            fmax + step / 4,
            fmax + step / 2,
            fmax + step / 2 + 1e-3 * step,
            fmax + step,
            fmax * 2,
            fmax - step / 2,
        ]
    for sub in (2.0**-9, 2.0**-16, 2.0**-24, 2.0**-133):
        vals += [sub, sub / 2, sub * 0.75, sub * 1.5, sub * 2.5, sub / 4]
    for normal in (2.0**-6, 2.0**-14, 2.0**-126):
        vals += [normal, normal * (1 - 2**-5), normal * (1 + 2**-4)]
    vals += [3.0e38, 3.4e38]
    return vals + [-v for v in vals]


def test_tensor(n: int = 1 << 20, seed: int = 0) -> torch.Tensor:
    """A fixed CPU fp32 tensor: the edge values, then ``n`` log-uniform magnitudes with random signs."""
    g = torch.Generator().manual_seed(seed)
    mags = torch.exp2(torch.empty(n).uniform_(-30.0, 20.0, generator=g))
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    return torch.cat([torch.tensor(edge_values(), dtype=torch.float32), mags * signs]).contiguous()


def _finite(fn):
    """Block formats on the finite elements only: one inf or NaN makes its whole block (the whole
    tensor, for ``tensor``) NaN, which would hide every other difference."""

    def run(t: torch.Tensor) -> torch.Tensor:
        return fn(t[torch.isfinite(t)])

    run.finite_only = True
    return run


def paths() -> dict:
    """Name -> function of a tensor, every rounding path the comparison covers."""
    from lossscale_bench.numerics.block_scaling import block_round
    from lossscale_bench.numerics.fp8 import round_fp8
    from lossscale_bench.precision import formats

    out = {}
    for name, fmt in formats.FORMATS.items():
        out[f"FloatFormat.round {name}"] = fmt.round
    for elem in ("e4m3", "e5m2"):
        for sat in (True, False):
            for impl in ("bits", "bits_compiled", "cast", "auto"):
                out[f"round_fp8 {elem} saturate={sat} impl={impl}"] = lambda t, e=elem, s=sat, i=impl: round_fp8(
                    t, e, s, i
                )
    for elem in ("e4m3", "e5m2"):
        for gran in ("tensor", "tile128"):
            out[f"block_round {elem} {gran}"] = _finite(lambda t, e=elem, g_=gran: block_round(t, e, g_))
        for mode in ("floor", "ceil", "even", "rceil"):
            out[f"block_round {elem} mx32 {mode}"] = _finite(
                lambda t, e=elem, m=mode: block_round(t, e, "mx32", mode=m)
            )
    for dtype in (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        out[f"torch cast {str(dtype).replace('torch.', '')} (raw, not used for e4m3)"] = lambda t, d=dtype: t.to(d).to(
            torch.float32
        )
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns, every NaN mapped to one pattern."""
    b = t.detach().to("cpu", torch.float32).contiguous().view(torch.int32).clone()
    b[torch.isnan(t.detach().cpu())] = 0x7FC00000
    return b


def compare(x: torch.Tensor, device: str, on_row=None) -> list[dict]:
    """Every path on ``x`` on the CPU and on ``device``; ``on_row(rows)`` after each (partial results
    survive a timeout: compiling a path for a new device can take a while)."""
    rows = []
    for name, fn in paths().items():
        row = {"path": name}
        try:
            a = fn(x.clone())
            b = fn(x.to(device)).cpu()
        except Exception as exc:  # noqa: BLE001 - a path missing on one device is a finding, not a crash
            row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            rows.append(row)
            if on_row:
                on_row(rows)
            continue
        if getattr(fn, "finite_only", False):
            x_cmp = x[torch.isfinite(x)]
        else:
            x_cmp = x
        ba, bb = _bits(a), _bits(b)
        diff = (ba != bb).nonzero().flatten()
        row.update(
            {
                "elements": x_cmp.numel(),
                "differ": int(diff.numel()),
                "nan_cpu": int(torch.isnan(a).sum()),
                "nan_device": int(torch.isnan(b).sum()),
                "examples": [
                    {"x": float(x_cmp[i]), "cpu": float(a[i]), device: float(b[i])} for i in diff[:6].tolist()
                ],
            }
        )
        rows.append(row)
        if on_row:
            on_row(rows)
    return rows


def render(res: dict) -> str:
    meta = res["meta"]
    rows = []
    for r in res["rows"]:
        if "error" in r:
            rows.append([r["path"], f"error: {r['error']}", "", "", ""])
            continue
        ex = "; ".join(f"{e['x']:g}: {e['cpu']:g} / {list(e.values())[2]:g}" for e in r["examples"][:3])
        rows.append([r["path"], r["differ"], r["nan_cpu"], r["nan_device"], ex])
    return (
        f"Rounding agreement, CPU vs {meta['device_name']} (torch {meta['torch']}, "
        f"{meta['elements']} elements: {meta['edge_values']} edge values + log-uniform 2^-30..2^20)\n\n"
        + markdown_table(
            ["path", "elements differing", "NaN on CPU", "NaN on device", "first differences (x: cpu / device)"], rows
        )
    )


def main(argv=None) -> int:
    ap = parser(__doc__, out=False)
    ap.add_argument("--out", default="runs/rounding", help="output folder")
    ap.add_argument("--cpu-only", action="store_true", help="compare the CPU with itself (smoke run)")
    ap.add_argument("--elements", type=int, default=1 << 20)
    args = ap.parse_args(argv)
    device = "cpu" if args.cpu_only else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("rounding_agreement: no CUDA device is visible; pass --cpu-only for a smoke run", file=sys.stderr)
        return 2
    x = test_tensor(args.elements)
    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    res = {
        "meta": {
            "device": device,
            "device_name": name,
            "torch": torch.__version__,
            "elements": x.numel(),
            "edge_values": len(edge_values()),
        },
        "rows": [],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(rows):
        res["rows"] = rows
        (out / "rounding_agreement.json").write_text(json.dumps(res, indent=1))

    save(compare(x, device, on_row=save))
    md = render(res)
    (out / "rounding_agreement.md").write_text(md + "\n")
    print(json.dumps(res, indent=1) if args.format == "json" else md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
