"""The SSD family: reference geometry, one training step each, backbone weight files."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torchvision.models import resnet34

from lossscale_bench.models import build_model, builder_of
from lossscale_bench.models.ssd import (
    CHAINERCV_SSD300,
    CHAINERCV_SSD512,
    DBOXES300_COCO,
    WeightsError,
    _VGG16Features,
    load_backbone_weights,
)


def _chainercv_default_boxes(cfg, grids):
    """chainercv MultiboxCoder's default boxes, as (cx, cy, w, h) relative to the image."""
    size, sizes, steps, ars = cfg["size"], cfg["sizes"], cfg["steps"], cfg["aspect_ratios"]
    out = []
    for k, grid in enumerate(grids):
        for v, u in itertools.product(range(grid), repeat=2):
            cy, cx = (v + 0.5) * steps[k], (u + 0.5) * steps[k]
            s = sizes[k]
            out.append((cx, cy, s, s))
            s2 = math.sqrt(sizes[k] * sizes[k + 1])
            out.append((cx, cy, s2, s2))
            for ar in ars[k]:
                out.append((cx, cy, s * math.sqrt(ar), s / math.sqrt(ar)))
                out.append((cx, cy, s / math.sqrt(ar), s * math.sqrt(ar)))
    return torch.tensor(out, dtype=torch.float64) / size


@pytest.mark.parametrize(
    "name,cfg,grids,clip",
    [
        ("ssd300_vgg16", CHAINERCV_SSD300, (38, 19, 10, 5, 3, 1), False),
        ("ssd512_vgg16", CHAINERCV_SSD512, (64, 32, 16, 8, 4, 2, 1), False),
        ("ssd300_resnet50", DBOXES300_COCO, (38, 19, 10, 5, 3, 1), True),
    ],
)
def test_default_boxes_match_the_reference(name, cfg, grids, clip):
    gen = builder_of(name).__globals__["_anchors"](cfg, cfg["size"], clip=clip)
    ours = gen._grid_default_boxes([[g, g] for g in grids], [cfg["size"], cfg["size"]], dtype=torch.float64)
    ref = _chainercv_default_boxes(cfg, grids)
    if clip:
        ref = ref.clamp(0, 1)
    assert ours.shape == ref.shape and ours.shape[0] == {300: 8732, 512: 24564}[cfg["size"]]
    assert torch.allclose(ours, ref, atol=1e-6)


def _one_step(model, size: int, batch: int) -> dict:
    feats = []
    hook = model.backbone.register_forward_hook(lambda m, i, o: feats.append([tuple(v.shape[-2:]) for v in o.values()]))
    model.train()
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, size, size, generator=g) for _ in range(batch)]
    targets = [
        {
            "boxes": torch.tensor([[10.0, 20.0, size * 0.6, size * 0.7], [size * 0.5, 5.0, size - 1.0, size * 0.4]]),
            "labels": torch.tensor([1, 2]),
        }
        for _ in range(batch)
    ]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    before = [p.detach().clone() for p in params[:3]] + [params[-1].detach().clone()]
    losses = model(images, targets)
    loss = sum(losses.values())
    assert torch.isfinite(loss)
    opt.zero_grad()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params if p.grad is not None)
    opt.step()
    after = [p.detach() for p in params[:3]] + [params[-1].detach()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    hook.remove()
    return {"maps": feats[0], "loss": float(loss.detach())}


def _construction_checks(name: str, model) -> None:
    if name.endswith("vgg16"):
        assert torch.all(model.backbone.scale_weight == 20.0)  # L2Norm initial scale (chainercv Normalize(20))
        assert model.anchor_generator.clip is False
        assert model.backbone.out_channels == [512, 1024, 512, 256, 256, 256] + ([256] if "512" in name else [])
        return
    extra_convs = [m for m in model.backbone.extra.modules() if isinstance(m, torch.nn.Conv2d)]
    bns = [m for m in model.backbone.extra.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    if name == "ssd300_resnet34":  # MLPerf: extras with bias and no BatchNorm
        assert not bns and all(m.bias is not None for m in extra_convs)
        assert model.backbone.out_channels[0] == 256
    else:  # NVIDIA v1.1: bias-free convs, each followed by BatchNorm
        assert len(bns) == 10 and all(m.bias is None for m in extra_convs)
        assert model.backbone.out_channels[0] == 1024
    block = model.backbone.features[6][0]
    assert block.conv1.stride == block.conv2.stride == block.downsample[0].stride == (1, 1)
    assert model.anchor_generator.clip is True


@pytest.mark.parametrize(
    "name,size,batch,maps",
    [
        ("ssd300_vgg16", 300, 1, [38, 19, 10, 5, 3, 1]),
        # SSD512 trained at 384 px to save CPU time (maps 48..1); its 512 px geometry is checked above
        ("ssd512_vgg16", 384, 1, [48, 24, 12, 6, 3, 2, 1]),
        ("ssd300_resnet34", 300, 1, [38, 19, 10, 5, 3, 1]),
        ("ssd300_resnet50", 300, 2, [38, 19, 10, 5, 3, 1]),  # BatchNorm on the 1x1 map needs batch > 1
    ],
)
def test_each_model_builds_and_trains_one_step(name, size, batch, maps):
    model = build_model(name, num_classes=3, image_size=size)
    _construction_checks(name, model)
    out = _one_step(model, size, batch)
    assert [m[0] for m in out["maps"]] == maps


def test_backbone_weights_round_trip_and_errors(tmp_path):
    torch.manual_seed(0)
    r34 = resnet34()
    path = tmp_path / "resnet34.pth"
    torch.save(r34.state_dict(), path)
    model = build_model("ssd300_resnet34", num_classes=3, backbone_weights=str(path))
    assert torch.equal(model.backbone.features[0].weight, r34.conv1.weight)
    assert torch.equal(model.backbone.features[6][5].conv2.weight, r34.layer3[5].conv2.weight)
    # nested under "state_dict", classifier dropped: still fine
    torch.save({"state_dict": {k: v for k, v in r34.state_dict().items() if not k.startswith("fc.")}}, path)
    model = build_model("ssd300_resnet34", num_classes=3, backbone_weights=str(path))
    assert torch.equal(model.backbone.features[4][0].conv1.weight, r34.layer1[0].conv1.weight)

    with pytest.raises(WeightsError, match="file not found: .*nothing.pth"):
        build_model("ssd300_resnet34", num_classes=3, backbone_weights=str(tmp_path / "nothing.pth"))
    # ResNet-34 weights for a ResNet-50 backbone: key names differ -> clear error naming keys
    with pytest.raises(WeightsError, match="does not match the backbone: missing .*layer1.0.bn3"):
        build_model("ssd300_resnet50", num_classes=3, backbone_weights=str(path))
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="cannot read"):
        build_model("ssd300_resnet34", num_classes=3, backbone_weights=str(tmp_path / "junk.pth"))


class _Net(torch.nn.Module):
    """Stands in for a torchvision classifier: ``features`` plus a ``classifier`` head."""

    def __init__(self, k: int = 3):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 4, k), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3))
        self.classifier = torch.nn.Linear(4, 10)


def test_features_only_file_and_shape_mismatch(tmp_path):
    src = _Net()
    path = tmp_path / "features.pth"
    torch.save({k: v for k, v in src.state_dict().items() if k.startswith("features.")}, path)
    target = _Net()
    load_backbone_weights(target, path)  # no classifier keys in the file: accepted
    assert torch.equal(target.features[2].weight, src.features[2].weight)
    torch.save(_Net(k=5).state_dict(), path)
    with pytest.raises(WeightsError, match="shape mismatch at \\['features.0.weight'\\]"):
        load_backbone_weights(_Net(), path)
    # the VGG SSDs take torchvision's vgg16 file layout (features.*), classifier optional
    vgg = _VGG16Features()
    torch.save(vgg.state_dict(), path)
    model = build_model("ssd300_vgg16", num_classes=3, backbone_weights=str(path))
    assert torch.equal(model.backbone.features[0].weight, vgg.features[0].weight)
    assert torch.equal(model.backbone.extra[0][1].weight, vgg.features[24].weight)  # conv5_1
