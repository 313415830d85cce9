"""The code of docs/guide/own-loop.md and docs/guide/lightning.md runs as written, block after block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs" / "guide"


def _blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def _run(page: str) -> dict:
    blocks = _blocks(page)
    assert len(blocks) >= 2, page
    namespace: dict = {"__name__": f"page_{page.replace('.', '_').replace('-', '_')}"}
    for k, code in enumerate(blocks):
        exec(compile(code, f"{page} block {k + 1}", "exec"), namespace)
    return namespace


def test_the_own_loop_page_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns = _run("own-loop.md")
    assert set(ns["scales"]) == {"0", "2"}  # the adaptive block's layer scales
    step, summary = ns["log"][-1]
    assert step == 10 and "flush_rate_max" in summary
    assert not any("forward" in m.__dict__ for m in ns["model"].modules())  # the with blocks left nothing


def test_the_lightning_page_runs(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)
    ns = _run("lightning.md")
    assert ns["trainer"].global_step == 3 * 4  # resumed after two epochs of four batches, one more epoch
    assert (tmp_path / "lightning_runs" / "two_epochs.ckpt").exists()
