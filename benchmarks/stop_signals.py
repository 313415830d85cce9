"""Send many stop signals to a running study and count how each ended (not a test; run by hand).

Each attempt starts ``lsbench run STUDY --executor local`` in a fresh runs folder, waits for its
``] start`` line, sleeps a delay spread evenly over ``--from``..``--to`` seconds (jittered), sends
SIGINT or SIGTERM (alternately) to the process group, and records the exit code and the MLflow
status of every run it left. A signal is *held* when the exit code is 130 (SIGINT) or 143
(SIGTERM) and no run is left RUNNING. The study is the one a stop signal was once lost on
(``tests/orchestration/test_stop_signals.py``'s ``REPRO``: ssd_tiny width 8, 64-px synthetic
16/8 images, ``fp8-e4m3-emulated``, dynamic loss scaling torch style, 80 iterations, evaluation
every 40, every step logged).

    python benchmarks/stop_signals.py [--signals 50] [--parallel 3] [--from 0.1] [--to 5.5] [--out DIR]

Prints one line per attempt and the counts; ``--out`` keeps the runs folders (default: a
temporary folder, removed).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "orchestration"))
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import parser  # noqa: E402
from test_stop_signals import REPRO  # noqa: E402  (the study of the test, verbatim)


def attempt(study: Path, runs: Path, signum: int, delay: float) -> dict:
    from mlflow.tracking import MlflowClient

    cmd = [sys.executable, "-m", "lossscale_bench.cli", "run", str(study), "--executor", "local"]
    cmd += ["--runs-dir", str(runs), "--no-report"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, bufsize=1
    )
    started = False
    try:
        for line in proc.stdout:
            if "] start" in line:
                started = True
                break
        time.sleep(delay)
        sent = proc.poll() is None
        if sent:
            os.killpg(proc.pid, signum)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("stops")
    statuses = [r.info.status for r in client.search_runs([exp.experiment_id])] if exp else []
    return {
        "signal": signal.Signals(signum).name,
        "delay_s": round(delay, 2),
        "started": started,
        "sent": sent,
        "rc": proc.returncode,
        "statuses": statuses,
        "ignored": "Exception ignored" in err,
        "last_line": (err.strip().splitlines() or [""])[-1][:200],
    }


def main() -> int:
    ap = parser(__doc__, out=False)
    ap.add_argument("--signals", type=int, default=50)
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--from", dest="lo", type=float, default=0.1)
    ap.add_argument("--to", dest="hi", type=float, default=5.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="lsbench-stops-"))
    work.mkdir(parents=True, exist_ok=True)
    study = work / "stops.yaml"
    study.write_text(REPRO)
    rng = random.Random(args.seed)
    n = args.signals
    cases = [
        (i, (signal.SIGINT, signal.SIGTERM)[i % 2], args.lo + (args.hi - args.lo) * (i + rng.random()) / n)
        for i in range(n)
    ]
    rng.shuffle(cases)

    def one(case):
        i, signum, delay = case
        res = attempt(study, work / f"runs{i:03d}", signum, delay)
        print(json.dumps({"i": i, **res}), flush=True)
        return res

    t0 = time.time()
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(one, cases))
    held = [r["rc"] == (130 if r["signal"] == "SIGINT" else 143) and "RUNNING" not in r["statuses"] for r in results]
    rcs = Counter((r["signal"], r["rc"]) for r in results)
    running = sum(r["statuses"].count("RUNNING") for r in results)
    print(f"{sum(held)} of {n} signals held; exit codes {dict(sorted(rcs.items()))}; RUNNING runs left: {running}; ")
    print(
        f"'Exception ignored' on stderr: {sum(r['ignored'] for r in results)}; not sent (study ended first): "
        f"{sum(not r['sent'] for r in results)}; {time.time() - t0:.0f} s, load {os.getloadavg()[0]:.1f}"
    )
    if not args.out:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(held) else 1


if __name__ == "__main__":
    sys.exit(main())
