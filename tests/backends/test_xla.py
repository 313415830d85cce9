"""XLA backend (torch_xla) on the XLA CPU device, ``PJRT_DEVICE=CPU``.

torch-xla 2.9.0 links against torch 2.9.0 exactly, so these tests run in their
own venv: ``make test-xla``. In the main venv (no torch_xla) only the
missing-package test runs. On the CPU device ``torch_xla.amp.autocast`` leaves
ops in fp32 (bf16 autocast is TPU-only), so the bf16 trial here checks the
code path (device, step marking, ``xm.optimizer_step``), not bf16 numerics.
"""

from __future__ import annotations

import importlib.util
import os
import textwrap

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")


def _has_xla() -> bool:
    if importlib.util.find_spec("torch_xla") is None:
        return False
    try:
        import torch_xla  # noqa: F401
    except Exception:  # noqa: BLE001 - e.g. undefined symbol against another torch
        return False
    return True


needs_xla = pytest.mark.skipif(not _has_xla(), reason="torch_xla not importable (make test-xla)")


@pytest.mark.skipif(_has_xla(), reason="torch_xla is installed")
def test_missing_torch_xla_is_one_line_with_install_hint():
    from lossscale_bench.backends import BackendUnavailable, get_backend

    with pytest.raises(BackendUnavailable) as info:
        get_backend("xla")
    msg = str(info.value)
    assert "\n" not in msg and "torch_xla" in msg and "pip install" in msg and "make test-xla" in msg


@needs_xla
def test_backend_device_autocast_and_optimizer_step():
    import torch

    from lossscale_bench.backends import BackendUnavailable, get_backend

    b = get_backend("xla")
    assert b.device.type == "xla" and b.ray_resources(devices=4) == {"CPU": 1.0, "TPU": 4.0}
    with pytest.raises(BackendUnavailable, match="bf16"):
        b.autocast(torch.float16)
    model = b.prepare_model(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().cpu().clone()
    x = torch.randn(8, 4).to(b.device)
    with b.autocast(torch.bfloat16):
        loss = model(x).pow(2).mean()
    loss.backward()
    b.after_backward()
    b.optimizer_step(opt)
    b.after_step()
    b.synchronize()
    after = model.weight.detach().cpu()
    assert torch.isfinite(after).all() and not torch.equal(before, after)
    assert "xla" in b.describe()


@needs_xla
def test_short_ssd_tiny_bf16_trial_on_the_xla_cpu_device(tmp_path):
    import math

    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.study import load_study_text
    from lossscale_bench.trial import run_trial

    study = load_study_text(
        textwrap.dedent("""\
        name: xla_tiny
        dataset: {name: synthetic, train_images: 8, val_images: 4, image_size: 64, seed: 0}
        model: ssd_tiny
        model_options: {width: 8}
        batch_size: 4
        precision: bf16
        scaling:
          - {method: none}
        seeds: [0]
        schedule: {iterations: 4, lr: 0.01, warmup_iterations: 1}
        eval: {every: 4, metric: coco, max_images: 4}
        log_every: 2
        resources: {backend: xla}
        """)
    )
    (cfg,) = study.trials()
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=tmp_path / "t", threads=1)
    assert out.status == "finished", out.error
    assert out.steps == 4
    losses = [v for _, v in sink.history("loss")]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    assert sink.tag_values["lsbench.backend"].startswith("xla")
    assert out.final_map is not None and 0.0 <= out.final_map <= 1.0


@needs_xla
def test_multi_device_launcher_path_on_one_cpu_device(tmp_path):
    """The xla branch of a multi-device trial, minus Ray: torch_xla.launch starts the replicas (one on the
    CPU device), each joins the ``xla`` process group and runs the trial; rank 0's reports and its final
    outcome come back through the multiprocessing queue. Real multi-chip runs need a TPU host."""
    import json

    from lossscale_bench.orchestration import distributed, placement
    from lossscale_bench.study import load_study_text

    (cfg,) = load_study_text(
        textwrap.dedent("""\
        name: xla_launch
        dataset: {name: synthetic, train_images: 8, val_images: 4, image_size: 64, seed: 0}
        model: ssd_tiny
        model_options: {width: 8}
        batch_size: 4
        precision: fp32
        scaling:
          - {method: none}
        schedule: {iterations: 2, lr: 0.01, warmup_iterations: 0}
        eval: {every: 2, metric: coco, max_images: 2}
        log_every: 1
        resources: {backend: xla, devices_per_trial: 2}
        """)
    ).trials()
    assert placement.worker_bundles(cfg.resources) == [{"CPU": 1.0, "TPU": 2.0}]

    class Channel:
        items: list = []

        def put(self, item):
            self.items.append(item)

    ch = Channel()
    distributed._xla_launch({"cfg": cfg.to_dict(), "trial_dir": str(tmp_path / "t"), "threads": 1}, ch)
    payloads = [json.loads(i["report"]["lsbench"]) for i in ch.items if i["kind"] == "report"]
    final = payloads[-1]
    assert ch.items[-1]["final"] and final["outcome"]["status"] == "finished"
    assert final["tags"]["lsbench.world_size"] == 1
    assert [s for k, _, s in sum((p["metrics"] for p in payloads), []) if k == "loss"] == [1, 2]
