"""benchmarks/gpu_check.py: the CPU smoke runs every section end to end; no CUDA -> exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def test_cpu_smoke_runs_every_section(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "gpu_check.json").read_text())
    assert res["meta"]["smoke"] is True and res["meta"]["device"] == "cpu"
    for key in "abcdef":
        sec = res["sections"][key]
        assert "error" not in sec, (key, sec.get("error"), sec.get("traceback"))
        if "skipped" in sec and isinstance(sec["skipped"], str):
            assert sec["skipped"].strip(), key  # a skip must say why
    a = res["sections"]["a"]
    assert a["pass"] and a["steps"] >= 4 and a["max_abs_param_diff"] == 0.0
    assert any(r["skipped_gradscaler"] for r in a["per_step"])  # the comparison covers a back-off
    assert res["sections"]["b"]["ratio_trainer_to_plain_images_per_s"] > 0
    assert {r["method"] for r in res["sections"]["c"]["rows"]} >= {
        "adaptive (update_every 1)",
        "adaptive (update_every 10)",
    }
    d = res["sections"]["d"]
    assert d["layers"] and d["max_abs_diff_flush"] is not None
    assert all("flush_fp8_emulated" in r for r in d["layers"])
    e = res["sections"]["e"]
    assert {r["label"] for r in e["runs"]} >= {"FP32 baseline", "fp16: adaptive"}
    assert len({r["seed"] for r in e["runs"]}) >= 2 and all(r["steps"] >= 1 for r in e["runs"])
    assert all(r["peak_mb"] >= 0 for r in res["sections"]["f"]["rows"])
    md = (out / "gpu_check.md").read_text()
    assert res["meta"]["device_name"] in md and "CPU smoke" in md
    assert md.strip() in p.stdout  # the markdown is printed too
    for key in "abcdef":
        assert f"**{key}." in md


def test_cpu_smoke_without_ray_mlflow_pydantic_pycocotools(tmp_path):
    """The GPU machine has none of these: the check must not need them (mAP is skipped, and says so)."""
    block = tmp_path / "block"
    for name in ("ray", "mlflow", "pydantic", "pydantic_core", "pycocotools", "nvidia_dali"):
        (block / name).mkdir(parents=True)
        (block / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked for this test')\n")
    out = tmp_path / "out"
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(block), str(ROOT)])
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "gpu_check.json").read_text())
    for key in "abcdef":
        assert "error" not in res["sections"][key], (key, res["sections"][key].get("traceback"))
    e = res["sections"]["e"]
    assert e["map"].startswith("skipped") and "pycocotools" in e["map"]
    assert all("map" not in r for r in e["runs"])
    assert "pycocotools is not importable" in (out / "gpu_check.md").read_text()


def test_without_cuda_exits_2_with_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(CUDA_VISIBLE_DEVICES=""),
    )
    assert p.returncode == 2
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert len(lines) == 1 and "CUDA" in lines[0], lines
    assert not (tmp_path / "out").exists()
