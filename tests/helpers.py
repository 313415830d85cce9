"""Helpers shared by test files (import as ``from helpers import ...``; tests/conftest.py puts tests/ on
sys.path). The small study every test starts from lives here too, and is re-exported by conftest.py.

``study_yaml(**overrides)`` writes the study most tests need: one tiny synthetic SSD trial in fp32 with
no loss scaling. A test names only what it is about::

    study_yaml(name="resume", precision="fp16-emulated",
               scaling=[{"method": "fixed", "scale": 128}, "{method: dynamic, interval: 10}"],
               schedule={"iterations": 400, "lr": 0.01, "warmup_iterations": 4})

A value replaces the whole top-level key; ``None`` removes the key; a key not in the base is appended.
Values are written as YAML flow text: a ``str`` goes in verbatim (so ``"{every: 4, metric: coco}"`` or
``"1.0e+30"`` mean what they mean in a study file), dicts and lists become ``{...}`` and ``[...]``.
``scaling`` is a list of entries (dicts or flow strings), written one per line as in the studies.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: the base study, key by key, in the order study files use
BASE_STUDY: dict[str, object] = {
    "name": "t",
    "dataset": {"name": "synthetic", "train_images": 16, "val_images": 4, "image_size": 64, "seed": 0},
    "model": "ssd_tiny",
    "model_options": {"width": 8},
    "batch_size": 4,
    "precision": "fp32",
    "scaling": [{"method": "none"}],
    "seeds": [0],
    "schedule": {"iterations": 6, "lr": 0.01, "warmup_iterations": 2},
    "eval": {"every": None, "metric": "coco"},
    "log_every": 2,
}


def flow(value) -> str:
    """``value`` as YAML flow text; strings are taken as YAML already."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, float):
        import yaml  # 1e30 -> 1.0e+30: PyYAML reads a bare "1e+30" as a string

        return yaml.safe_dump(value).splitlines()[0]
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return str(value)


def study_yaml(**overrides) -> str:
    """The base study's YAML text with ``overrides`` applied (see the module docstring)."""
    study = {**BASE_STUDY, **overrides}
    lines = []
    for key, value in study.items():
        if value is None:
            continue
        if key == "scaling" and isinstance(value, (list, tuple)):
            lines.append("scaling:")
            lines += [f"  - {flow(entry)}" for entry in value]
        else:
            lines.append(f"{key}: {flow(value)}")
    return "\n".join(lines) + "\n"


def tiny_data_study(dataset: str, *, name: str = "t", eval: str = "{metric: voc07}") -> str:
    """The smallest study on real-layout data (``dataset``: its YAML flow text), 2 iterations of
    batch 2 at 64 px: for tests of what the data checks and the trial make of a data folder."""
    return study_yaml(
        name=name,
        dataset=dataset,
        model_options={"width": 8, "image_size": 64},
        batch_size=2,
        seeds=None,
        log_every=None,
        schedule={"iterations": 2, "lr": "1.0e-3"},
        eval=eval,
    )


def write_study(tmp_path: Path, name: str = "s.yaml", **overrides) -> Path:
    """``study_yaml(**overrides)`` written to ``tmp_path / name``; the file's path."""
    path = Path(tmp_path) / name
    path.write_text(study_yaml(**overrides))
    return path


# --------------------------------------------------------------------------- the CLI in a fresh interpreter
#: ``prefix`` for :func:`lsbench` that makes root obey file modes, as any user does (root without
#: CAP_DAC_OVERRIDE); empty where the tests do not run as root or there is no setpriv
AS_USER = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if os.geteuid() == 0 and shutil.which("setpriv")
    else []
)
#: whether a read-only folder stops this process's children from writing (root without setpriv: no)
MODES_OBEYED = os.geteuid() != 0 or bool(AS_USER)


def lsbench(*args, cwd=None, timeout=300, env=None, prefix=()) -> subprocess.CompletedProcess:
    """``lsbench ARGS`` (``python -m lossscale_bench.cli``) in a fresh interpreter, output captured as text.
    ``env`` adds to the environment; ``prefix`` goes before the interpreter (e.g. ``setpriv ...``)."""
    cmd = [*prefix, sys.executable, "-m", "lossscale_bench.cli", *map(str, args)]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


#: what a library's own message looks like on the terminal: a Python warning
#: (``file.py:12: UserWarning: ...``), a logging record with its level (Ray, MLflow, alembic, torch's
#: Python loggers), torch's C++ warnings (``[W1126 09:00:00.000 ...]``), a Ray worker's or raylet's
#: forwarded line (``(pid=123)``, ``(TrainTrainable pid=123)``, ``(raylet)``), and the texts seen
#: before (Inductor's ``No CUDA runtime is found, using CUDA_HOME=...``, MLflow's progress bars)
LIBRARY_LINE = re.compile(
    r"\w+Warning\b|\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b[: \]]|^\[[WIE]\d{4} |"
    r"^\((\w+ )?pid=\d+|^\(raylet|CUDA_HOME|No CUDA runtime|Downloading artifacts|alembic|"
    r"pydantic|Traceback \(most recent call last\)"
)


def one_error_line(r: subprocess.CompletedProcess, *words: str) -> str:
    """The one ``stderr`` line of a command refused with exit 2 (no traceback), holding every one of ``words``."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def library_lines(text: str) -> list[str]:
    """The lines of ``text`` that come from a library, not from lsbench (:data:`LIBRARY_LINE`)."""
    return [ln for ln in text.splitlines() if LIBRARY_LINE.search(ln)]


# --------------------------------------------------------------------------- crash and resume one trial
def crash_and_resume(
    cfg, tmp_path: Path, monkeypatch, *, crash_at_step: int = 5, checkpoint_every: int = 4, after_crash=None
):
    """Run ``cfg`` straight through in ``tmp_path/a``; then in ``tmp_path/b`` run it until step
    ``crash_at_step`` raises (a simulated crash after the last checkpoint) and run it again, resuming.

    Returns ``(straight, first, second)``: each a ``(TrialOutcome, MemorySink)`` pair for the straight run,
    the crashed run and the resumed run. ``after_crash(outcome)``, if given, runs between the crash and the
    resume (to check what the crash left). Torch's thread count is restored afterwards."""
    import torch

    from lossscale_bench.engine import loop
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.trial import run_trial

    def run(where):
        sink = MemorySink()
        return run_trial(cfg, sink=sink, trial_dir=tmp_path / where, threads=1, checkpoint_every=checkpoint_every), sink

    before = torch.get_num_threads()
    real_step = loop.Trainer.train_step
    try:
        straight = run("a")

        def crash(self, images, targets):
            if self.state.step == crash_at_step:
                raise RuntimeError("simulated crash")
            return real_step(self, images, targets)

        monkeypatch.setattr(loop.Trainer, "train_step", crash)
        first = run("b")
        if after_crash is not None:
            after_crash(first[0])
        monkeypatch.setattr(loop.Trainer, "train_step", real_step)
        second = run("b")
    finally:
        monkeypatch.setattr(loop.Trainer, "train_step", real_step)
        torch.set_num_threads(before)
    return straight, first, second


# --------------------------------------------------------------------------- data folders
def coco_from_synthetic(
    tmp_path: Path, *, train_images: int, val_images: int, seed: int, image_size: int = 64
) -> tuple[Path, dict]:
    """A COCO-2017-layout folder (``tmp_path/coco``) made from the synthetic set; returns the root and
    the synthetic set's paths (``ensure_synthetic``'s dict: its annotation JSONs, to edit copies of)."""
    import shutil

    from lossscale_bench.data.synthetic import ensure_synthetic

    p = ensure_synthetic(
        Path(tmp_path) / "syn", train_images=train_images, val_images=val_images, image_size=image_size, seed=seed
    )
    root = Path(tmp_path) / "coco"
    (root / "annotations").mkdir(parents=True)
    shutil.copytree(p["train_images"], root / "train2017")
    shutil.copytree(p["val_images"], root / "val2017")
    shutil.copy(p["train_ann"], root / "annotations" / "instances_train2017.json")
    shutil.copy(p["val_ann"], root / "annotations" / "instances_val2017.json")
    return root, p


# --------------------------------------------------------------------------- detection batches
def random_detection_batch(n: int, size: int, seed: int = 1):
    """``n`` random ``size``x``size`` images with two random boxes each (labels 1..3): (images, targets)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    images = [torch.rand(3, size, size, generator=g) for _ in range(n)]
    targets = []
    for _ in range(n):
        xy = torch.rand(2, 2, generator=g) * (size * 0.6)
        wh = size / 8 + torch.rand(2, 2, generator=g) * (size * 0.4)
        targets.append(
            {"boxes": torch.cat([xy, (xy + wh).clamp(max=size)], 1), "labels": torch.randint(1, 4, (2,), generator=g)}
        )
    return images, targets


def one_entry_study(entry: str, precision: str = "fp16-emulated") -> str:
    """A study whose only interesting part is one scaling entry (YAML flow text) in ``precision``:
    for validation and trial-id tests of a single entry."""
    return (
        f"name: t\ndataset: synthetic\nmodel: ssd_tiny\nbatch_size: 8\nprecision: {precision}\n"
        f"schedule: {{iterations: 10, lr: 1e-3}}\nscaling:\n  - {entry}\n"
    )


# --------------------------------------------------------------------------- the kangaroo photos
def _main_checkout(repo: Path) -> Path | None:
    """The main checkout of the git worktree ``repo`` (itself when it is one), or None without git."""
    try:
        common = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(common).parent if common else None


def kangaroo_root() -> tuple[Path | None, str]:
    """``(root, "")`` of the 164 real kangaroo photos in VOC layout, or ``(None, why)`` when absent.

    Looked for in ``$LSBENCH_KANGAROO`` where it is set (and nowhere else then), else in
    ``<repo>/../shared/data/kangaroo`` (a CI clone, the main checkout) and the same beside the main checkout
    of a git worktree, which lives elsewhere. Never copied into the project: the set has no licence to ship."""
    repo = Path(__file__).resolve().parents[1]
    env = os.environ.get("LSBENCH_KANGAROO")
    if env:
        candidates = [Path(env)]
    else:
        main = _main_checkout(repo)
        candidates = [where / "shared" / "data" / "kangaroo" for where in (repo.parent, main and main.parent) if where]
    for cand in candidates:
        if (cand / "ImageSets" / "Main" / "test.txt").is_file():
            return cand.resolve(), ""
    return (
        None,
        f"the kangaroo photos are not here (looked in: {', '.join(map(str, candidates))}; set LSBENCH_KANGAROO)",
    )


# --------------------------------------------------------------------------- headless Chromium
def find_chromium() -> str | None:
    """The Chromium (or Chrome) on PATH, or ``$LSBENCH_CHROMIUM``; None where there is none (the browser
    tests then skip, saying so)."""
    for name in (
        os.environ.get("LSBENCH_CHROMIUM"),
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
        "chrome",
    ):
        if name and (path := shutil.which(name)):
            return path
    return None


#: the browser the browser tests use, or None
CHROMIUM = find_chromium()
#: the reason a browser test gives for skipping where there is none
NO_CHROMIUM = "no chromium on PATH (apt-get install -y chromium)"


def headless_chromium(tmp: Path, *args: str, timeout: int = 90) -> subprocess.CompletedProcess:
    """Chromium headless with ``args`` (a page to dump, say), no network (a page that needed it would show
    it), its profile and HOME under ``tmp``; a non-zero exit fails the test."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--hide-scrollbars",
        "--mute-audio",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        "--virtual-time-budget=5000",
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "HOME": str(tmp)})
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def trial_trainer(tmp: Path, entry: dict, **study):
    """A trial's ``Trainer`` as the runner builds it (data, precision, scaler, telemetry and metric hooks) for one
    scaling ``entry`` of ``study_yaml(**study)`` (E4M3-emulated and endless unless ``study`` says otherwise),
    written in ``tmp``; its batches in ``trainer.batches``, its hooks' ``before_train`` run. For tests that step
    a trial by hand."""
    from lossscale_bench.data.dali import make_batches
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.study import load_study
    from lossscale_bench.trial import runner, setup

    base = {"precision": "fp8-e4m3-emulated", "schedule": {"iterations": 10**6, "lr": 0.01, "warmup_iterations": 2}}
    path = tmp / "study.yaml"
    path.write_text(study_yaml(**{**base, **study, "scaling": [entry]}))
    cfg = load_study(str(path)).trials()[0]
    sink = MemorySink()
    parts = setup.build_parts(cfg, sink, tmp, 1)
    trainer = runner._trainer(cfg, parts, sink, tmp, tmp / "ck.pt", 10**9, 0, None)
    trainer.batches = iter(make_batches(cfg, parts.train_ds, 0))
    for h in trainer.hooks:
        h.before_train(trainer)
    return trainer
