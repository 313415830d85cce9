"""What every benchmark script shares: timing, the order settings run in, repeats, the command line and the
markdown (or JSON) it writes. A script keeps only what it measures.

Import it from a script in this folder (run as ``python benchmarks/x.py``, as ``PYTHONPATH=. python
benchmarks/x.py``, or loaded by path from a test) with::

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import ...

Importing it puts the repository root on ``sys.path`` too, so the scripts import ``lossscale_bench`` from
this checkout without ``PYTHONPATH``. It needs the standard library only (``gpu_check.py`` runs with a
GPU machine's system Python).

The pieces:

* timing: :func:`time_calls` (``perf_counter``, untimed warmup calls, then repeats), :func:`summary`
  (median, spread, mean), :func:`percentile`;
* order: :func:`order` (the settings of one round: rotated, A B B A, or as given) and :func:`interleave`
  (every setting once per round, in that order, warmup rounds untimed); :func:`child_json` runs one
  setting in a fresh process for the scripts whose settings cannot share one (process-wide state);
* statistics: :func:`ratio_interval`, a paired percentile bootstrap over rounds of a ratio of means;
* output: :func:`parser` (``--repeats``, ``--out``, ``--format markdown|json``), :func:`markdown_table`
  and :class:`Report` (notes and tables, written as markdown or JSON to stdout and ``--out``);
  :func:`cpu_description` for the line above a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

__all__ = [
    "HERE",
    "ORDERS",
    "ROOT",
    "Report",
    "child_json",
    "cpu_description",
    "format_cell",
    "interleave",
    "markdown_table",
    "order",
    "parser",
    "percentile",
    "ratio_interval",
    "summary",
    "time_calls",
]

#: this folder, and the repository root above it
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # `python benchmarks/x.py` imports this checkout's package without PYTHONPATH
    sys.path.insert(0, str(ROOT))

#: how the settings of one round are ordered: ``rotate`` (round r starts at setting r: A B C, B C A, ...),
#: ``abba`` (as given in even rounds, reversed in odd ones) or ``fixed`` (as given in every round)
ORDERS = ("rotate", "abba", "fixed")


# ---------------------------------------------------------------------------
# timing
def time_calls(
    fn: Callable[[], object],
    repeats: int,
    warmup: int = 0,
    *,
    per_call: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds per call of ``fn``: ``warmup`` untimed calls, then ``repeats`` timings, each of ``per_call``
    calls in a row divided by ``per_call`` (for calls too short to time one at a time)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(per_call):
            fn()
        out.append((clock() - t0) / per_call)
    return out


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``xs`` as the element at index ``int(q * n)`` of the sorted values
    (``q = 0.1``: the tenth percentile the call-cost tables report)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(xs: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """``median``, ``min``, ``max``, ``mean`` and ``n`` of ``xs``, each value times ``scale`` (1e3: ms)."""
    return {
        "median": statistics.median(xs) * scale,
        "min": min(xs) * scale,
        "max": max(xs) * scale,
        "mean": statistics.fmean(xs) * scale,
        "n": len(xs),
    }


# ---------------------------------------------------------------------------
# order
def order(names: Sequence, rnd: int, how: str = "rotate") -> list:
    """The settings ``names`` in the order round ``rnd`` runs them (``how``: one of :data:`ORDERS`)."""
    names = list(names)
    if how == "rotate":
        k = rnd % len(names) if names else 0
        return names[k:] + names[:k]
    if how == "abba":
        return names if rnd % 2 == 0 else names[::-1]
    if how == "fixed":
        return names
    raise ValueError(f"order: {how!r}; allowed: {', '.join(ORDERS)}")


def interleave(
    runs: dict[str, Callable[[int], float | None]], rounds: int, warmup: int = 0, how: str = "rotate"
) -> dict[str, list[float]]:
    """``runs[name](rnd)`` once per setting and round, in :func:`order`'s order; each call returns its own
    seconds (a call times what it measures, not its set-up) or None for nothing to record. The first
    ``warmup`` rounds are run and not recorded. Background load on a shared machine then hits every
    setting alike."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    for rnd in range(warmup + rounds):
        for name in order(list(runs), rnd, how):
            dt = runs[name](rnd)
            if rnd >= warmup and dt is not None:
                out[name].append(dt)
    return out


def child_json(
    argv: Sequence[str],
    *,
    env: dict | None = None,
    cwd: Path | str = ROOT,
    timeout: float | None = None,
    what: str = "child",
) -> dict:
    """Run ``python argv...`` in a fresh process and return the JSON object on the last stdout line that
    starts with ``{``; exit with its stderr's tail when it fails (``what`` names it)."""
    p = subprocess.run(
        [sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"{what} failed:\n{p.stderr[-3000:]}")
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------
# statistics
def ratio_interval(row: list[float], base: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """``mean(row) / mean(base)`` over paired rounds, and its 95 % percentile bootstrap interval (rounds
    resampled together, seeded)."""
    rng = random.Random(seed)
    k = len(row)
    point = statistics.fmean(row) / statistics.fmean(base)
    boots = []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        boots.append(sum(row[i] for i in idx) / sum(base[i] for i in idx))
    boots.sort()
    return point, boots[int(0.025 * n)], boots[int(0.975 * n) - 1]


def cpu_description() -> str:
    """CPU model and the vector extensions that decide torch's kernels (AVX2, AVX-512, AMX)."""
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("", "unknown CPU", platform.processor()):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    ext = sorted(
        f
        for f in flags
        if f
        in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile")
    )
    return f"{model}, {os.cpu_count()} CPUs, {' '.join(ext) or 'no AVX2'}"


# ---------------------------------------------------------------------------
# command line and output
def parser(
    doc: str | None,
    *,
    repeats: int | None = None,
    repeats_flags: Iterable[str] = (),
    repeats_help: str = "repeats (rounds) of every setting",
    out: bool = True,
    **kwargs,
) -> argparse.ArgumentParser:
    """The common command line: ``--format markdown|json`` and, unless ``out=False`` (a script whose
    ``--out`` is a folder of its own), ``--out FILE`` (the output written there too); with ``repeats``,
    ``--repeats N`` (default ``repeats``; ``repeats_flags`` are other spellings a script's documented
    commands use, e.g. ``--rounds``). The description is ``doc``'s first paragraph."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0], **kwargs)
    if repeats is not None:
        ap.add_argument(
            "--repeats",
            *repeats_flags,
            dest="repeats",
            type=int,
            default=repeats,
            help=f"{repeats_help} (default {repeats})",
        )
    if out:
        ap.add_argument("--out", type=Path, help="also write the output to this file")
    ap.add_argument(
        "--format",
        choices=("markdown", "json"),
        default="markdown",
        help="markdown tables (default) or one JSON object",
    )
    return ap


def format_cell(v: object, float_fmt: str = "{:.3f}") -> str:
    """A table cell: None as "–", booleans as yes/no, floats with ``float_fmt``, anything else as ``str``."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return float_fmt.format(v)
    return str(v)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence], float_fmt: str = "{:.3f}") -> str:
    """A markdown table: cells as given when they are strings (format numbers where you know their
    precision), floats with ``float_fmt``, None as "–", booleans as yes/no."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(format_cell(v, float_fmt) for v in r) + " |" for r in rows]
    return "\n".join(lines)


class Report:
    """A script's output: lines of text and tables in order, printed as they come (markdown) and written
    at the end as markdown or JSON (``{"notes": [...], "tables": [{"name", "header", "rows"}], **data}``)."""

    def __init__(self, fmt: str = "markdown", out: Path | None = None, echo: bool = True):
        self.fmt, self.out, self.echo = fmt, out, echo
        self.parts: list[str] = []
        self.notes: list[str] = []
        self.tables: list[dict] = []
        self.data: dict = {}

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Report:
        """A report for a :func:`parser` command line (its ``--format`` and ``--out``)."""
        return cls(getattr(args, "format", "markdown"), getattr(args, "out", None))

    def _show(self, text: str) -> None:
        self.parts.append(text)
        if self.echo and self.fmt == "markdown":
            print(text, flush=True)

    def note(self, text: str) -> None:
        """A line (or paragraph) of text."""
        self.notes.append(text)
        self._show(text)

    def table(
        self,
        header: Sequence[str],
        rows: Iterable[Sequence],
        name: str = "",
        float_fmt: str = "{:.3f}",
        raw_rows: Iterable[Sequence] | None = None,
    ) -> str:
        """Add (and print) a markdown table; JSON gets ``raw_rows`` (numbers unformatted) where given."""
        rows = [list(r) for r in rows]
        text = markdown_table(header, rows, float_fmt)
        self.tables.append(
            {
                "name": name,
                "header": list(header),
                "rows": [list(r) for r in raw_rows] if raw_rows is not None else rows,
            }
        )
        self._show(text)
        return text

    def markdown(self) -> str:
        """Everything so far, as printed."""
        return "\n".join(self.parts)

    def finish(self) -> str:
        """Write the output to ``--out`` (and, for JSON, to stdout); returns it."""
        if self.fmt == "json":
            text = json.dumps({"notes": self.notes, "tables": self.tables, **self.data}, indent=1, default=str)
            if self.echo:
                print(text)
        else:
            text = self.markdown()
        if self.out is not None:
            Path(self.out).parent.mkdir(parents=True, exist_ok=True)
            Path(self.out).write_text(text + "\n")
        return text
