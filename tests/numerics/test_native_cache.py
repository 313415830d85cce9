"""The C library's cache (numerics/native.py ``_build``): every build leaves a record of its size and sha256
beside the library, every load compares the file with it first, and a file that does not match (cut short,
empty, a corrupt ELF, another library in its place, no record at all) is rebuilt with one ``lsbench: note:``
line and then used, with the same results as a clean cache. A library cut short used to be mapped as it lay:
"Bus error", exit 135, in every later run."""

import ctypes
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import lsbench, study_yaml
from lossscale_bench.numerics import native
from lossscale_bench.numerics.lazy_compile import same_values

CC = native._compiler()
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler here")


def _cut(lib: Path) -> None:
    os.truncate(lib, lib.stat().st_size // 2)


def _corrupt(lib: Path) -> None:  # the same size, 256 bytes in the middle inverted
    data = bytearray(lib.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 256] = bytes(b ^ 0xFF for b in data[mid : mid + 256])
    lib.write_bytes(bytes(data))


def _stub(lib: Path) -> None:  # a well-formed library without the functions
    src = lib.parent / "stub.c"
    src.write_text("int lsb_nothing(void) { return 0; }\n")
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, timeout=120)
    src.unlink()


DAMAGE = {
    "cut in half": _cut,
    "empty": lambda lib: lib.write_bytes(b""),
    "corrupt ELF": _corrupt,
    "stub library": _stub,
    "no record (an older version's cache)": lambda lib: native.record_path(lib).unlink(),
    "garbled record": lambda lib: native.record_path(lib).write_text("not a record\n"),
}


def _sources(tmp_path: Path) -> Path:
    """A one-function source folder: builds in a fraction of a second (the real one takes a minute)."""
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "one.c").write_text("int lsb_one(void) { return 41 + 1; }\n")
    return src


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cached_library_is_rebuilt_with_one_note_then_left_alone(tmp_path, monkeypatch, capsys, damage):
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    src = _sources(tmp_path)
    lib = native._build(CC, src)
    assert native._problem(lib) is None and native.record_path(lib).is_file()
    assert capsys.readouterr().err == ""
    DAMAGE[damage](lib)
    assert native._problem(lib) is not None
    assert native._build(CC, src) == lib
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith(f"lsbench: note: {lib}: the cached C library "), said
    assert said[0].endswith("; rebuilding it"), said
    assert native._problem(lib) is None and ctypes.CDLL(str(lib)).lsb_one() == 42
    stamp = lib.stat().st_mtime_ns
    assert native._build(CC, src) == lib and lib.stat().st_mtime_ns == stamp  # a good hit is not rebuilt
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in lib.parent.iterdir()) == [lib.name, native.record_path(lib).name]


def test_a_rebuild_that_fails_is_the_build_error_the_loader_falls_back_on(tmp_path, monkeypatch, capsys):
    """A compiler that reports the same version but cannot compile: the note, then the compiler's error
    (``library()`` turns it into its warning and the torch kernels); the damaged file is not loaded."""
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    src = _sources(tmp_path)
    lib = native._build(CC, src)
    _cut(lib)
    broken = tmp_path / "cc"
    broken.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then exec {CC} --version; fi\nexit 1\n')
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(RuntimeError, match="cc failed"):
        native._build(str(broken), src)
    assert "the cached C library is " in capsys.readouterr().err
    assert native._problem(lib) is not None  # still damaged, still refused next time


_ROUND = """
import sys, torch
from lossscale_bench.numerics import block_scaling as bs, fp4, fp8, native
from lossscale_bench.numerics.fp8_formats import E4M3, E5M2
g = torch.Generator().manual_seed(0)
x = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-30, 10, (4096,), generator=g).float())
out = [fp8._round_f32(x, E4M3, True, "native"), fp8._round_f32(x, E5M2, False, "native"),
       bs.block_round(x, "e4m3", "mx32"), fp4.fp4_round(x, "nvfp4")]
assert native.library() is not None, native.failure()
"""


def _metrics(runs: Path, name: str) -> dict:
    """Every step's logged value of every metric of the study's one trial, but the host's and the clock's."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if "lsbench.trial_id" in r.data.tags]
    assert run.info.status == "FINISHED"
    keys = [k for k in run.data.metrics if not k.startswith("host_") and k != "images_per_sec"]
    return {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)] for k in keys}


@pytest.mark.slow
def test_a_run_on_a_cut_library_rebuilds_it_and_trains_and_rounds_as_on_a_clean_cache(tmp_path):
    """The C library this process loaded, cut in half in a cache of its own: ``lsbench run`` (an fp8 trial,
    whose rounding the C loops do) notes the rebuild once, finishes, and logs every value a run on an intact
    copy logs; the rebuilt library then rounds bit for bit as this process's does. (One real build: about a
    minute on a busy machine.)"""
    here = native.library()
    if here is None:
        pytest.skip(f"no C library here: {native.failure()}")
    built = Path(here._name)
    caches = {"clean": tmp_path / "clean", "cut": tmp_path / "cut"}
    for cache in caches.values():
        cache.mkdir()
        for path in (built, native.record_path(built)):
            shutil.copy(path, cache / path.name)
    _cut(caches["cut"] / built.name)
    study = study_yaml(
        name="nat",
        precision="fp8-e4m3-emulated",
        dataset={"name": "synthetic", "train_images": 8, "val_images": 4, "image_size": 32, "seed": 0},
        schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 1},
        scaling=["{method: dynamic}"],
        log_every=1,
    )
    (tmp_path / "s.yaml").write_text(study)
    got = {}
    for what, cache in caches.items():
        runs = tmp_path / f"runs-{what}"
        args = ("run", "s.yaml", "--runs-dir", runs, "--executor", "local", "--no-report")
        r = lsbench(*args, cwd=tmp_path, timeout=900, env={native.CACHE_ENV: str(cache)})
        assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
        notes = [ln for ln in r.stderr.splitlines() if "the cached C library" in ln]
        assert len(notes) == (what == "cut"), r.stderr[-3000:]
        got[what] = _metrics(runs, "nat")
    assert got["cut"] == got["clean"] and got["clean"]["loss"]
    assert native._problem(caches["cut"] / built.name) is None
    out = tmp_path / "rounded.pt"
    env = {**os.environ, native.CACHE_ENV: str(caches["cut"])}
    script = _ROUND + "torch.save(out, sys.argv[1])\n"
    done = subprocess.run(
        [sys.executable, "-c", script, str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and "the cached C library" not in done.stderr, done.stderr[-3000:]
    mine: dict = {}
    exec(_ROUND, mine)  # the same roundings through this process's library
    assert same_values(torch.load(out), mine["out"])
