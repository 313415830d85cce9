"""torchvision's one-stage detectors as study models (models/torchvision_detectors.py): what the builders
build, the label convention, backbone weights from a file, and the per-layer scalers on their graphs
(depthwise convolutions, FPN top-down merges, GroupNorm heads, focal loss)."""

from __future__ import annotations

import random

import pytest
import torch
import torchvision
from torchvision.models.detection.retinanet import RetinaNet

from helpers import random_detection_batch
from lossscale_bench.models import build_model
from lossscale_bench.models.ssd import WeightsError
from lossscale_bench.models.torchvision_detectors import FCOSLabels, RetinaNetLabels
from lossscale_bench.scaling.adaptive import AdaptiveLossScaler

NAMES = ("ssdlite320_mobilenet_v3_large", "retinanet_resnet50_fpn_v2", "fcos_resnet50_fpn")


def _shapes(model) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_the_names_are_registered_models():
    from lossscale_bench.study.plugins import entry, names

    assert set(NAMES) <= set(names("model"))
    assert entry("model", "fcos_resnet50_fpn").display == "FCOS-R50-FPN"


def test_ssdlite_is_torchvisions_model_at_width_one():
    ours = build_model("ssdlite320_mobilenet_v3_large", num_classes=4)
    theirs = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=4
    )
    assert _shapes(ours) == _shapes(theirs)
    assert ours.transform.fixed_size == (320, 320)


def test_image_size_sets_the_input_size():
    ssd = build_model("ssdlite320_mobilenet_v3_large", num_classes=4, image_size=96)
    assert ssd.transform.fixed_size == (96, 96) and ssd.transform.min_size == (96,)
    for name in NAMES[1:]:
        m = build_model(name, num_classes=4, image_size=96)
        assert m.transform.min_size == (96,) and m.transform.max_size == 96
        images, _ = random_detection_batch(1, 150)
        batched, _ = m.transform(images)
        assert batched.tensors.shape[-2:] == (96, 96)  # 150 px resized to the model's size


def test_width_mult_narrows_ssdlite_and_it_still_trains():
    full = build_model("ssdlite320_mobilenet_v3_large", num_classes=4, image_size=64)
    narrow = build_model("ssdlite320_mobilenet_v3_large", num_classes=4, image_size=64, width_mult=0.25)
    assert sum(p.numel() for p in narrow.parameters()) < sum(p.numel() for p in full.parameters()) / 5
    images, targets = random_detection_batch(2, 64)
    losses = narrow(images, targets)
    sum(losses.values()).backward()
    assert all(torch.isfinite(v) for v in losses.values())


@pytest.mark.parametrize("name", NAMES[1:])
def test_sigmoid_detectors_never_return_the_background_label(name):
    """RetinaNet and FCOS have no background class: column 0 of ``num_classes = K + 1`` is never a
    target. Forced to score high there, torchvision's model returns label 0; ours drops it."""
    torch.manual_seed(0)
    model = build_model(name, num_classes=4, image_size=64)
    assert type(model) in (RetinaNetLabels, FCOSLabels)
    with torch.no_grad():
        model.head.classification_head.cls_logits.bias.copy_(
            torch.tensor([8.0, -8.0, -8.0, -8.0]).repeat(model.head.classification_head.num_anchors)
        )
    model.eval()
    images, _ = random_detection_batch(1, 64)
    plain = type(model).__mro__[2]  # torchvision's class: same module, its postprocessing
    model.__class__ = plain
    assert (model(images)[0]["labels"] == 0).any()  # torchvision: label 0 everywhere
    model.__class__ = RetinaNetLabels if plain is RetinaNet else FCOSLabels
    out = model(images)[0]
    assert len(out["labels"]) == len(out["boxes"]) == len(out["scores"])
    assert not (out["labels"] == 0).any()


def test_batched_loss_applies_to_ssdlite_only():
    from lossscale_bench.models.multibox_loss import BatchedLossSSD

    assert type(build_model("ssdlite320_mobilenet_v3_large", 4, image_size=64, batched_loss=True)) is BatchedLossSSD
    assert type(build_model("fcos_resnet50_fpn", 4, image_size=64, batched_loss=True)) is FCOSLabels


def test_ssdlite_batched_loss_equals_torchvisions():
    torch.manual_seed(0)
    a = build_model("ssdlite320_mobilenet_v3_large", 4, image_size=64)
    b = build_model("ssdlite320_mobilenet_v3_large", 4, image_size=64, batched_loss=True)
    b.load_state_dict(a.state_dict())
    images, targets = random_detection_batch(2, 64)
    la, lb = a(images, targets), b(images, targets)
    for k in la:
        assert torch.allclose(la[k], lb[k], rtol=1e-5, atol=1e-6), k


@pytest.mark.parametrize(
    "name,backbone,where",
    [
        ("ssdlite320_mobilenet_v3_large", lambda: torchvision.models.mobilenet_v3_large(), "backbone.features.0"),
        ("fcos_resnet50_fpn", lambda: torchvision.models.resnet50(), "backbone.body"),
    ],
)
def test_backbone_weights_from_a_file(tmp_path, name, backbone, where):
    torch.manual_seed(1)
    net = backbone()
    path = tmp_path / "backbone.pt"
    torch.save(net.state_dict(), path)
    model = build_model(name, num_classes=4, image_size=64, backbone_weights=str(path))
    first_conv = next(v for k, v in model.state_dict().items() if k.startswith(where) and k.endswith("weight"))
    assert torch.equal(first_conv, next(iter(net.state_dict().values())))
    torch.save({"layer9.weight": torch.zeros(3)}, tmp_path / "wrong.pt")
    with pytest.raises(WeightsError, match="does not match the backbone"):
        build_model(name, num_classes=4, image_size=64, backbone_weights=str(tmp_path / "wrong.pt"))


@pytest.mark.parametrize("name", NAMES)
def test_forced_power_of_two_layer_scales_are_exact(name):
    """Every Conv2d of the model (depthwise ones, FPN laterals and top-down outputs, GroupNorm heads)
    gets its own power-of-two scale; after unscaling, the gradients are plain backward's."""
    torch.manual_seed(0)
    model = build_model(name, num_classes=4, image_size=64)
    model.train()
    images, targets = random_detection_batch(2, 64)
    sum(model(images, targets).values()).backward()
    ref = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    rng = random.Random(0)
    forced: dict[str, float] = {}

    def scale_fn(layer, g, w, prev):
        return forced.setdefault(layer, 2.0 ** rng.randint(-3, 6))

    scaler = AdaptiveLossScaler(model, init_scale=8.0, scale_fn=scale_fn)
    n_convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert scaler.skipped_layers == [] and len(scaler.layer_names) == n_convs
    scaler.scale(sum(model(images, targets).values())).backward()
    scaled = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    result = scaler.last_step
    scaler.update()
    assert not result.skipped
    assert len(forced) >= n_convs - 1 and len(set(forced.values())) > 3
    assert scaler.metrics()["ada_merge_points"] >= 4  # residual adds, FPN merges, shared heads
    assert set(scaled) == set(ref)
    assert any(float((scaled[k] - r).norm() / r.norm().clamp_min(1e-30)) > 0.5 for k, r in ref.items())
    for k, r in ref.items():
        got = model.get_parameter(k).grad
        assert float((got - r).norm() / r.norm().clamp_min(1e-30)) <= 1e-5, k
    scaler.remove()


# ---------------------------------------------------------------------------
# through `lsbench run`: every scaling method on each detector, E4M3 everywhere, per-layer telemetry
METHODS = (
    "{method: none, label: m-none}",
    "{method: fixed, scale: 128, label: m-fixed}",
    "{method: dynamic, style: torch, label: m-dynamic}",
    "{method: adaptive, label: m-adaptive}",
    "{method: layerwise_dynamic, label: m-layerwise}",
    "{method: amax, recipe: current, margin: 1, label: m-amax}",
    "{method: saturation, init_scale: 65536, interval: 50, label: m-saturation}",
)


def test_the_rows_cover_every_scaling_method():
    from lossscale_bench.study.plugins import names

    assert {e.split(",")[0].split(": ")[1] for e in METHODS} == set(names("method", entry_points=False))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_method_trains_through_lsbench_run(tmp_path, name):
    from helpers import lsbench, study_yaml

    study = tmp_path / "s.yaml"
    study.write_text(
        study_yaml(
            name="tvdet",
            dataset={"name": "synthetic", "train_images": 4, "val_images": 2, "image_size": 64, "seed": 0},
            model=name,
            model_options={"image_size": 64},
            batch_size=2,
            precision="fp8-e4m3-emulated",
            scaling=list(METHODS),
            schedule={"iterations": 2, "lr": 0.01, "warmup_iterations": 1},
            log_every=1,
        )
    )
    runs = ["--runs-dir", str(tmp_path / "runs")]
    r = lsbench("run", study, *runs, "--executor", "local", "--no-report", "--quiet", timeout=1800)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "7 finished, 0 diverged, 0 failed" in r.stdout, r.stdout[-2000:]
    r = lsbench("report", *runs, "--study", "tvdet", "--telemetry", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("| row"))
    cols = [c.strip() for c in head.split("|")[2:-1]]
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]] for ln in lines if "| m-" in ln}
    assert set(rows) == {e.split("label: ")[1].rstrip("}") for e in METHODS}, r.stdout
    layer_scale = cols.index("layer scale log2, median (last)")
    for per_layer in ("m-adaptive", "m-layerwise", "m-amax"):  # the per-layer scalers' scales are shown
        float(rows[per_layer][layer_scale])
    assert rows["m-fixed"][layer_scale] == "–"
    flushed = cols.index("flushed (act. grads)")
    assert all(rows[k][flushed].endswith("%") for k in rows)  # the activation-gradient census ran
