"""The device-specific speed options that can be checked without a GPU: foreach SGD on CPU (the same
update, bit for bit), the parts ``resources.compile`` compiles (names and state dict unchanged), the
schema's refusal of ``compile`` off CUDA, and which loader a study that names none gets."""

from __future__ import annotations

import copy

import pytest
import torch

from lossscale_bench.backends import get_backend
from lossscale_bench.backends.base import BackendUnavailable
from lossscale_bench.backends.cuda import compile_parts
from lossscale_bench.engine.schedule import build_optimizer
from lossscale_bench.models import build_model
from lossscale_bench.study import load_study_text
from lossscale_bench.study.errors import StudyError
from lossscale_bench.study.grid import default_loader

SCHED = {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "iterations": 3}


def _params_after_steps(impl: dict, steps: int = 3) -> torch.Tensor:
    torch.manual_seed(0)
    model = build_model("ssd_tiny", num_classes=4, image_size=64, width=4)
    opt = build_optimizer(model, SCHED, impl)
    gen = torch.Generator().manual_seed(1)
    images = [torch.rand(3, 64, 64, generator=gen) for _ in range(2)]
    targets = [{"boxes": torch.tensor([[4.0, 6.0, 40.0, 50.0]]), "labels": torch.tensor([1])}] * 2
    for _ in range(steps):
        opt.zero_grad()
        sum(model(images, targets).values()).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_cpu_foreach_sgd_is_the_same_update_bit_for_bit():
    impl = get_backend("cpu").optimizer_options()
    assert impl == {"foreach": True}
    model = build_model("ssd_tiny", num_classes=4, image_size=64, width=4)
    assert build_optimizer(model, SCHED, impl).param_groups[0]["foreach"] is True
    assert build_optimizer(model, {**SCHED, "momentum_style": "chainer"}, impl) is not None  # ignored there
    assert torch.equal(_params_after_steps(impl), _params_after_steps({}))


def test_compile_parts_keeps_names_and_state():
    model = build_model("ssd_tiny", num_classes=4, image_size=64, width=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = [n for n, _ in model.named_modules()]
    assert compile_parts(model) == ["backbone", "head"]
    assert model.backbone._compiled_call_impl is not None and model.head._compiled_call_impl is not None
    assert getattr(model, "_compiled_call_impl", None) is None  # matching/loss stay eager
    assert [n for n, _ in model.named_modules()] == names
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert compile_parts(copy.deepcopy(model), parts=("nothing_here",)) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_backend_without_a_device_says_so():
    with pytest.raises(BackendUnavailable, match="no CUDA device"):
        get_backend("cuda", compile=True)


STUDY = """
name: opts
dataset: {name: synthetic, train_images: 8, val_images: 4, image_size: 64}
model: [ssd_tiny]
model_options: {width: 8, image_size: 64}
batch_size: [2]
precision: fp32
scaling: [{method: none}]
schedule: {iterations: 3, lr: 0.01}
"""


def test_compile_only_on_cuda_and_not_in_the_trial_id():
    with pytest.raises(StudyError, match="resources.compile"):
        load_study_text(STUDY + "resources: {backend: cpu, compile: true}\n")
    (plain,) = load_study_text(STUDY + "resources: {backend: cuda}\n").trials()
    (compiled,) = load_study_text(STUDY + "resources: {backend: cuda, compile: true}\n").trials()
    assert compiled.resources["compile"] is True and plain.trial_id == compiled.trial_id


def test_default_loader(tmp_path, monkeypatch):
    assert default_loader("cpu", {"name": "synthetic"}) == "torch"
    (cpu,) = load_study_text(STUDY).trials()
    assert cpu.loader == "torch"
    # a stand-in nvidia.dali package: found, not imported (the driver only asks whether it is there)
    (tmp_path / "nvidia" / "dali").mkdir(parents=True)
    (tmp_path / "nvidia" / "dali" / "__init__.py").write_text("raise RuntimeError('not imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert default_loader("cuda", {"name": "synthetic"}) == "dali"
    assert default_loader("cuda", {"name": "coco2017", "fake_data": True}) == "torch"
    assert default_loader("cuda", {"name": "voc0712"}) == "torch"
    (gpu,) = load_study_text(STUDY + "resources: {backend: cuda}\n").trials()
    (given,) = load_study_text(STUDY + "resources: {backend: cuda}\nloader: torch\n").trials()
    assert gpu.loader == "dali" and given.loader == "torch" and gpu.trial_id != given.trial_id
