"""SSD detectors built on torchvision's SSD machinery (loss, matching, anchors, post-processing).

Nothing is downloaded: models start from random initialisation, or load
backbone weights from a local file (``backbone_weights``), checked by key.
``num_classes`` includes the background class (torchvision's convention:
object labels are 1..K).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torchvision.models import resnet34, resnet50, vgg16
from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
from torchvision.models.detection.ssd import SSD, _vgg_extractor

from ..registry import MODEL_NAMES

# torchvision's SSD300 VGG normalisation: inputs in [0, 1] become 0..255 minus the mean.
_VGG_MEAN = [0.48235, 0.45882, 0.40784]
_VGG_STD = [1.0 / 255.0] * 3


class WeightsError(ValueError):
    """A backbone weight file is missing or does not match the backbone."""


def load_backbone_weights(module: nn.Module, path: str | Path) -> None:
    """Load a local state dict into ``module``, refusing files whose keys do not match.

    Accepts a plain state dict or one nested under ``state_dict``/``model``;
    a classifier head present in the file (``fc.*``, ``classifier.*``) is
    ignored because detectors drop it.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise WeightsError(f"backbone_weights: file not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise WeightsError(f"backbone_weights: cannot read {path}: {exc}") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
    if not isinstance(state, dict):
        raise WeightsError(f"backbone_weights: {path} does not hold a state dict")
    own = module.state_dict()
    state = {k: v for k, v in state.items() if k in own or not k.startswith(("fc.", "classifier."))}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise WeightsError(
            f"backbone_weights: {path} does not match the backbone: "
            f"missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
            f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}")
    bad = [k for k in own if tuple(own[k].shape) != tuple(state[k].shape)]
    if bad:
        raise WeightsError(f"backbone_weights: {path}: shape mismatch at {bad[:3]}")
    module.load_state_dict(state)


# ---------------------------------------------------------------------------
# ssd_tiny: a small VGG-style SSD for CPU studies (FIELD-NOTES "A tiny SSD")
class TinyVGGBackbone(nn.Module):
    """Plain 3x3 convs, no BatchNorm (like VGG, so gradients underflow like VGG's).

    Feature maps at strides 8/16/32/64, each feeding both the next stage and a
    multibox head: the branch structure adaptive scaling must handle.
    """

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        w = width

        def conv(cin, cout, stride=1):
            return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.ReLU(inplace=True)]

        self.stem = nn.Sequential(*conv(3, w), nn.MaxPool2d(2), *conv(w, 2 * w), nn.MaxPool2d(2),
                                  *conv(2 * w, 2 * w), nn.MaxPool2d(2), *conv(2 * w, 2 * w))
        self.stage2 = nn.Sequential(*conv(2 * w, 4 * w, 2), *conv(4 * w, 4 * w))
        self.stage3 = nn.Sequential(*conv(4 * w, 4 * w, 2))
        self.stage4 = nn.Sequential(*conv(4 * w, 4 * w, 2))
        self.out_channels = [2 * w, 4 * w, 4 * w, 4 * w]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        f1 = self.stem(x)
        f2 = self.stage2(f1)
        f3 = self.stage3(f2)
        f4 = self.stage4(f3)
        return OrderedDict([("0", f1), ("1", f2), ("2", f3), ("3", f4)])


def ssd_tiny(num_classes: int, image_size: int = 128, width: int = 16, backbone_weights=None, **kw) -> SSD:
    backbone = TinyVGGBackbone(width)
    if backbone_weights:
        load_backbone_weights(backbone, backbone_weights)
    anchors = DefaultBoxGenerator([[2], [2, 3], [2, 3], [2]], min_ratio=0.1, max_ratio=0.9)
    return SSD(backbone, anchors, (image_size, image_size), num_classes,
               image_mean=[0.5, 0.5, 0.5], image_std=[0.25, 0.25, 0.25], **kw)


# ---------------------------------------------------------------------------
# VGG16 SSD300 / SSD512 (torchvision's extractor; SSD512 uses its highres block)
def _vgg_backbone(highres: bool, backbone_weights) -> nn.Module:
    vgg = vgg16()
    if backbone_weights:
        load_backbone_weights(vgg, backbone_weights)
    extractor = _vgg_extractor(vgg, highres, trainable_layers=5)
    # Declared, so torchvision does not probe the channels with a dummy forward.
    extractor.out_channels = [512, 1024, 512, 256, 256, 256] + ([256] if highres else [])
    return extractor


def ssd300_vgg16(num_classes: int, image_size: int = 300, backbone_weights=None, **kw) -> SSD:
    anchors = DefaultBoxGenerator([[2], [2, 3], [2, 3], [2, 3], [2], [2]],
                                  scales=[0.07, 0.15, 0.33, 0.51, 0.69, 0.87, 1.05],
                                  steps=[8, 16, 32, 64, 100, 300])
    return SSD(_vgg_backbone(False, backbone_weights), anchors, (image_size, image_size), num_classes,
               image_mean=_VGG_MEAN, image_std=_VGG_STD, **kw)


def ssd512_vgg16(num_classes: int, image_size: int = 512, backbone_weights=None, **kw) -> SSD:
    # chainercv SSD512 default box sizes 35.84 .. 537.6 px on a 512 image
    anchors = DefaultBoxGenerator([[2], [2, 3], [2, 3], [2, 3], [2, 3], [2], [2]],
                                  scales=[0.07, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.05],
                                  steps=[8, 16, 32, 64, 128, 256, 512])
    return SSD(_vgg_backbone(True, backbone_weights), anchors, (image_size, image_size), num_classes,
               image_mean=_VGG_MEAN, image_std=_VGG_STD, **kw)


# ---------------------------------------------------------------------------
# ResNet SSD300 (MLPerf SSD-ResNet34; NVIDIA SSD300 v1.1 ResNet-50)
class ResNetSSDBackbone(nn.Module):
    """ResNet up to layer3 with layer3's stride removed (38x38 at 300 px), then SSD extra blocks.

    This is the layout of NVIDIA's SSD300 v1.1 and the MLPerf single-stage
    detector: residual additions and BatchNorm give adaptive scaling its
    branch-merge and pass-through cases.
    """

    def __init__(self, resnet: nn.Module) -> None:
        super().__init__()
        self.features = nn.Sequential(resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool,
                                      resnet.layer1, resnet.layer2, resnet.layer3)
        block = resnet.layer3[0]
        for name in ("conv1", "conv2"):
            conv = getattr(block, name)
            if conv.stride == (2, 2):
                conv.stride = (1, 1)
        if block.downsample is not None:
            block.downsample[0].stride = (1, 1)
        c3 = resnet.layer3[-1].conv2.out_channels if hasattr(resnet.layer3[-1], "conv2") and not hasattr(
            resnet.layer3[-1], "conv3") else resnet.layer3[-1].conv3.out_channels
        chans = [c3, 512, 512, 256, 256, 256]
        mids = [256, 256, 128, 128, 128]
        extra = []
        for i, (cin, mid, cout) in enumerate(zip(chans[:-1], mids, chans[1:])):
            stride, pad = (2, 1) if i < 3 else (1, 0)
            extra.append(nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                nn.Conv2d(mid, cout, 3, stride=stride, padding=pad, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True)))
        self.extra = nn.ModuleList(extra)
        self.out_channels = chans

    def forward(self, x: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        x = self.features(x)
        out = [x]
        for block in self.extra:
            x = block(x)
            out.append(x)
        return OrderedDict((str(i), v) for i, v in enumerate(out))


def _resnet_ssd300(factory: Callable[[], nn.Module], num_classes: int, image_size: int, backbone_weights, **kw):
    resnet = factory()
    if backbone_weights:
        load_backbone_weights(resnet, backbone_weights)
    anchors = DefaultBoxGenerator([[2], [2, 3], [2, 3], [2, 3], [2], [2]],
                                  scales=[0.07, 0.15, 0.33, 0.51, 0.69, 0.87, 1.05],
                                  steps=[8, 16, 32, 64, 100, 300])
    return SSD(ResNetSSDBackbone(resnet), anchors, (image_size, image_size), num_classes, **kw)


def ssd300_resnet34(num_classes: int, image_size: int = 300, backbone_weights=None, **kw) -> SSD:
    return _resnet_ssd300(resnet34, num_classes, image_size, backbone_weights, **kw)


def ssd300_resnet50(num_classes: int, image_size: int = 300, backbone_weights=None, **kw) -> SSD:
    return _resnet_ssd300(resnet50, num_classes, image_size, backbone_weights, **kw)


BUILDERS: dict[str, Callable[..., SSD]] = {
    "ssd_tiny": ssd_tiny,
    "ssd300_vgg16": ssd300_vgg16,
    "ssd512_vgg16": ssd512_vgg16,
    "ssd300_resnet34": ssd300_resnet34,
    "ssd300_resnet50": ssd300_resnet50,
}
assert tuple(BUILDERS) == MODEL_NAMES


def build_model(name: str, num_classes: int, **options) -> SSD:
    """Build a detector by registry name; ``options`` are the study's ``model_options``."""
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    return BUILDERS[name](num_classes, **options)
