"""Cost of the emulation's rounding kernels per 2 M fp32 elements, side by side in one run.

Why: the fp8 emulation rounds every conv/linear output and every gradient; torch's eager CPU cast
to ``float8_e4m3fn`` is the slow one, and this is the table that chose the
default implementation in ``lossscale_bench.numerics``. Rows are timed round-robin (one call of
each row per round) so machine noise hits them alike; the median over rounds is reported. Before
timing, every fp8 row is checked bit for bit against torch's cast, and the compiled block-scaled
rows against their eager versions.

    .venv/bin/python benchmarks/fp8_rounding.py                  # 2**21 elements, 1 thread, 50 rounds
    .venv/bin/python benchmarks/fp8_rounding.py --rounds 100 --numel 4194304

Prints a markdown table (paste it into docs/records/index.md with the command), the first-call
(compile) time of each compiled kernel, and the number of Inductor graphs one kernel compiled for 20
gradient shapes.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, interleave, parser  # noqa: E402

from lossscale_bench.numerics.block_scaling import block_round  # noqa: E402
from lossscale_bench.numerics.fp8 import compiled_kernel, round_fp8  # noqa: E402
from lossscale_bench.numerics.fp8_formats import E4M3  # noqa: E402


def gradient_like(n: int, seed: int = 0) -> torch.Tensor:
    """Random signs and significands over magnitudes 2^-30 .. 2^20 (what gradients span)."""
    g = torch.Generator().manual_seed(seed)
    mant = torch.rand(n, generator=g) + 1.0
    exp = torch.randint(-30, 21, (n,), generator=g).float()
    return torch.where(torch.rand(n, generator=g) < 0.5, -mant, mant) * torch.exp2(exp)


def rows(x: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    r: dict[str, Callable[[], torch.Tensor]] = {
        "fp32 multiply (reference)": lambda: x * 2.0,
        "fp16 round trip, eager cast": lambda: x.half().float(),
        "E5M2, eager torch cast": lambda: round_fp8(x, "e5m2", impl="cast"),
        "E5M2, compiled bit split": lambda: round_fp8(x, "e5m2", impl="bits_compiled"),
        "E4M3, eager torch cast": lambda: round_fp8(x, "e4m3", impl="cast"),
        "E4M3, compiled torch cast": lambda: round_fp8(x, "e4m3", impl="cast_compiled"),
        "E4M3, eager bit split": lambda: round_fp8(x, "e4m3", impl="bits"),
        "E4M3, compiled bit split (default)": lambda: round_fp8(x, "e4m3", impl="bits_compiled"),
        "E4M3 non-saturating, compiled bit split": lambda: round_fp8(x, "e4m3", False, impl="bits_compiled"),
    }
    for mode in ("floor", "rceil"):
        for compiled in (False, True):
            r[f"MX32 E4M3 {mode}, {'compiled' if compiled else 'eager'}"] = lambda mode=mode, compiled=compiled: (
                block_round(x, "e4m3", "mx32", mode=mode, compiled=compiled)
            )
    for gran, pow2 in (("tile128", True), ("tensor", False)):
        for compiled in (False, True):
            r[f"{gran} E4M3{' pow2' if pow2 else ''}, {'compiled' if compiled else 'eager'}"] = (
                lambda gran=gran, compiled=compiled: block_round(x, "e4m3", gran, compiled=compiled)
            )
    r["MX32 E4M3 floor + counts, compiled"] = lambda: block_round(x, "e4m3", "mx32", counts=True, compiled=True)
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

        def torchao_mx():
            scale, data = to_mx(x.view(-1, 32), torch.float8_e4m3fn, 32, ScaleCalculationMode.FLOOR)
            return to_dtype(data, scale, torch.float8_e4m3fn, 32, torch.float32)

        r["MX32 E4M3 floor, torchao to_mx + to_dtype, eager"] = torchao_mx
    except ImportError:
        pass
    return r


def check(x: torch.Tensor) -> None:
    """Refuse to time anything that is not exact."""
    for fmt, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        ref = x.to(dtype).float().view(torch.int32)
        for impl in ("cast", "cast_compiled", "bits", "bits_compiled"):
            assert torch.equal(round_fp8(x, fmt, impl=impl).view(torch.int32), ref), (fmt, impl)
    for gran, kw in (("mx32", {"mode": "floor"}), ("mx32", {"mode": "rceil"}), ("tile128", {}), ("tensor", {})):
        a = block_round(x, "e4m3", gran, compiled=False, **kw)
        b = block_round(x, "e4m3", gran, compiled=True, **kw)
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), gran


def first_calls() -> list[tuple[str, float]]:
    """Compile (first-call) time of kernels not yet used in this process."""
    out = []
    y = gradient_like(4096, seed=1)
    for name, fn in (
        ("E4M3 saturating bit split", lambda: round_fp8(y, "e4m3", impl="bits_compiled")),
        ("MX32 E4M3 ceil", lambda: block_round(y, "e4m3", "mx32", mode="ceil")),
        ("tile128 E5M2", lambda: block_round(y, "e5m2", "tile128")),
    ):
        t0 = time.perf_counter()
        fn()
        out.append((name, time.perf_counter() - t0))
    return out


def graphs_for_twenty_shapes() -> int:
    """Inductor graphs the default E4M3 kernel holds after 20 more gradient shapes (1: no
    recompilation; it was compiled once before)."""
    k = compiled_kernel("bits", E4M3, True)
    shapes = [
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
        (8, 64, 16, 16),
    ]
    for i, shape in enumerate(shapes):
        round_fp8(gradient_like(math.prod(shape), seed=i).reshape(shape), "e4m3")
    return k.graphs


def main() -> None:
    ap = parser(__doc__, repeats=50, repeats_flags=("--rounds",), repeats_help="rounds, one call of each row a round")
    ap.add_argument("--numel", type=int, default=2**21)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    compile_s = first_calls()  # before anything else compiles, so these include Inductor's start
    x = gradient_like(args.numel)
    check(x)
    table = rows(x)
    for fn in table.values():  # warm-up: compile every kernel, fill caches
        fn()

    def timed(fn):
        def run(rnd: int) -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

        return run

    times = interleave({name: timed(fn) for name, fn in table.items()}, args.repeats, how="fixed")
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    rep = Report.from_args(args)
    rep.note(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.numel:,} fp32 elements, "
        f"median of {args.repeats} interleaved rounds\n"
    )
    base, cast = med["fp32 multiply (reference)"], med["E4M3, eager torch cast"]
    rep.table(
        ["operation", "median (ms)", "min (ms)", "x fp32 multiply", "x E4M3 eager cast"],
        [
            [name, f"{m:.2f}", f"{min(times[name]) * 1e3:.2f}", f"{m / base:.1f}", f"{m / cast:.2f}"]
            for name, m in med.items()
        ],
        name="kernels",
    )
    rep.note(
        "\n"
        + "\n".join(
            f"first call (compile, or load from Inductor's cache) of {name}: {s:.1f} s" for name, s in compile_s
        )
    )
    rep.note(f"Inductor graphs of the E4M3 kernel after 20 more gradient shapes: {graphs_for_twenty_shapes()}")
    rep.finish()


if __name__ == "__main__":
    main()
