"""What ``resources: {repeatable: true}`` costs: ssd_tiny fp32 step time with and without the pins.

The pins are environment variables read when torch starts (lossscale_bench/core/portable.py), so each
setting runs in a fresh process; the settings alternate, round after round, so a shared machine's
load hits each alike. Per round and setting: the median of ``--steps`` timed steps after
``--warmup``, one torch thread (a demo trial's). Besides the switch's own pins (AVX2), the lowest
levels the libraries offer (ATen ``default``, oneDNN SSE4.1): the cost of narrower vectors on
this machine, the nearest one CPU gets to what capping an AVX-512 machine at AVX2 costs there.

    .venv/bin/python benchmarks/repeatable_cost.py --rounds 3 --steps 30 --warmup 5

Prints a markdown table (docs/records/index.md "Repeatable across CPUs"), with each setting's final weights as
a SHA-256 prefix (one value when every round agreed): the pinned setting's value, for the same ``--steps``
and ``--warmup``, is what another x86 machine with AVX2 must print too (the switch's promise), so the table
doubles as a check across machines.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import HERE, ROOT, Report, child_json, order, parser  # noqa: E402

from lossscale_bench.core.portable import PORTABLE_ENV  # noqa: E402  (torch-free)

SETTINGS = {
    "unpinned": {},
    "repeatable (AVX2 pins)": dict(PORTABLE_ENV),
    "lowest levels (ATen default, oneDNN SSE4.1)": {
        **PORTABLE_ENV,
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}

_CHILD = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from scaler_overhead import SIZES, build, random_batch
steps, warmup = int(sys.argv[2]), int(sys.argv[3])
tr = build("ssd_tiny", {"method": "none"}, "fp32", "cpu")
size, n = SIZES["ssd_tiny"]
times = []
for i in range(warmup + steps):
    images, targets = random_batch(size, n, i)
    t0 = time.perf_counter()
    tr.train_step(images, targets)
    if i >= warmup:
        times.append(time.perf_counter() - t0)
import hashlib
h = hashlib.sha256()
for k, v in tr.model.state_dict().items():
    h.update(k.encode()); h.update(v.detach().contiguous().numpy().tobytes())
print(json.dumps({"median_s": statistics.median(times), "capability": torch.backends.cpu.get_cpu_capability(),
                  "weights": h.hexdigest()[:16]}))
"""


def run_one(env: dict, steps: int, warmup: int) -> dict:
    """One fresh process under ``env`` (the pins cleared first, then set); its median step and ATen level."""
    full = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}
    full.update(env, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return child_json(
        ["-c", _CHILD, str(HERE), str(steps), str(warmup)],
        env=full,
        cwd=Path.cwd(),
        what=", ".join(f"{k}={v}" for k, v in env.items()) or "unpinned",
    )


def main() -> None:
    ap = parser(__doc__, repeats=3, repeats_flags=("--rounds",), repeats_help="rounds of one fresh process per setting")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    per: dict[str, list[float]] = {name: [] for name in SETTINGS}
    levels: dict[str, str] = {}
    weights: dict[str, set[str]] = {name: set() for name in SETTINGS}
    for r in range(args.repeats):
        for name in order(SETTINGS, r, "fixed"):
            res = run_one(SETTINGS[name], args.steps, args.warmup)
            per[name].append(res["median_s"])
            levels[name] = res["capability"]
            weights[name].add(res["weights"])
            print(f"round {r + 1}: {name}: {res['median_s'] * 1000:.1f} ms", file=sys.stderr, flush=True)
    base = statistics.median(per["unpinned"])
    rep = Report.from_args(args)
    rep.note(
        f"ssd_tiny fp32, batch 8, 128 px, 1 thread; {args.repeats} alternating rounds of {args.steps} timed "
        f"steps after {args.warmup} warm-up, one fresh process each\n"
    )
    rows = [
        [
            name,
            levels[name],
            ", ".join(f"{t * 1000:.1f}" for t in ts),
            f"{statistics.median(ts) * 1000:.1f}",
            f"{statistics.median(ts) / base:.3f}",
            " / ".join(sorted(weights[name])),
        ]
        for name, ts in per.items()
    ]
    rep.table(
        [
            "setting",
            "ATen level",
            "median step per round (ms)",
            "median of rounds (ms)",
            "ratio to unpinned",
            "final weights (SHA-256, 16 hex)",
        ],
        rows,
        name="settings",
    )
    rep.finish()


if __name__ == "__main__":
    main()
