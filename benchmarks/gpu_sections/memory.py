"""Section f: peak memory per scaling method (``torch.cuda.max_memory_allocated`` on CUDA; the resident
high-water mark of a fresh process per method on CPU)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import torch
from harness import HERE, ROOT
from scaler_overhead import METHODS

from .common import base_model, free_memory, make_batches, make_trainer

__all__ = ["F_METHODS", "memory_one", "section_f"]


F_METHODS = METHODS  # every method of benchmarks/scaler_overhead.py


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _proc_status_mb(field: str) -> float | None:
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset the process's resident high-water mark (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _proc_status_mb("VmHWM") is not None
    except OSError:
        return False


def memory_one(device: str, precision: str, model_name: str, batch: int, steps: int, method_name: str) -> dict:
    """One method's peak memory in this process (the CPU child of :func:`section_f` runs it alone)."""
    batches = make_batches(model_name, batch, 1)
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        hwm = _reset_hwm()
        base = (_proc_status_mb("VmRSS") if hwm else _maxrss_mb()) * 2**20
    backend, model = base_model(model_name, device)
    tr = make_trainer(model, backend, F_METHODS[method_name], precision)
    for _ in range(steps):
        tr.train_step(*batches[0])
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        measure = "torch.cuda.max_memory_allocated, minus what was allocated before the model was built"
    else:
        if hwm:
            peak = _proc_status_mb("VmHWM") * 2**20
            measure = (
                "resident high-water mark (VmHWM, reset after imports) of a fresh process per method, "
                "minus its resident size then (process peak in brackets)"
            )
        else:
            peak = _maxrss_mb() * 2**20
            measure = (
                "ru_maxrss of a fresh process per method, minus its value after imports (process peak in brackets)"
            )
    return {"peak_mb": (peak - base) / 2**20, "process_peak_mb": peak / 2**20, "measure": measure}


def section_f(cfg: dict, sc: dict) -> dict:
    """Each method's peak memory over a few steps (on CPU, one fresh process per method)."""
    deadline = time.monotonic() + sc["budget_s"]
    rows = []
    for name in F_METHODS:
        if time.monotonic() > deadline and rows:
            rows.append({"method": name, "skipped": "time budget"})
            continue
        if cfg["device"] == "cuda":
            r = memory_one("cuda", cfg["precision"], sc["model"], sc["batch"], sc["steps"], name)
            free_memory()
        else:
            # ru_maxrss only grows: one fresh process per method
            cmd = [
                sys.executable,
                str(HERE / "gpu_check.py"),
                "--_memory",
                name,
                "--_memory-args",
                json.dumps([cfg["device"], cfg["precision"], sc["model"], sc["batch"], sc["steps"]]),
            ]
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            left = max(10.0, deadline - time.monotonic() + 10.0)
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env)
            if p.returncode != 0:
                raise RuntimeError(f"memory probe for {name} failed: {p.stderr.strip().splitlines()[-1:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append({"method": name, **r})
    return {
        "model": sc["model"],
        "batch": sc["batch"],
        "steps": sc["steps"],
        "precision": cfg["precision"],
        "rows": rows,
    }
