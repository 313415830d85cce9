"""SSD detectors built on torchvision's SSD machinery (loss, matching, anchors, post-processing).

Nothing is downloaded: models start from random initialisation, or load
backbone weights from a local file (``backbone_weights``), checked by key. For the VGG16
SSDs that file may also hold ``conv6.*``/``conv7.*`` (the fc-reduced VGG16 that chainercv and
the SSD paper start from; ``lsbench weights convert`` writes it, :mod:`.convert`).
``num_classes`` includes the background class (torchvision's convention:
object labels are 1..K).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import resnet34, resnet50
from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
from torchvision.models.detection.ssd import SSD, SSDFeatureExtractorVGG, _vgg_extractor
from torchvision.models.vgg import cfgs as vgg_cfgs
from torchvision.models.vgg import make_layers as make_vgg_layers

# torchvision's SSD300 VGG normalisation: inputs in [0, 1] become 0..255 minus the mean.
_VGG_MEAN = [0.48235, 0.45882, 0.40784]
_VGG_STD = [1.0 / 255.0] * 3


class WeightsError(ValueError):
    """A backbone weight file is missing or does not match the backbone."""


def read_weights(path: str | Path) -> dict:
    """A local state dict (plain, or nested under ``state_dict``/``model``), read without running code."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise WeightsError(f"backbone_weights: file not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsError(f"backbone_weights: cannot read {path}: {why}") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
    if not isinstance(state, dict):
        raise WeightsError(f"backbone_weights: {path} does not hold a state dict")
    return state


def load_state_checked(module: nn.Module, state: dict, path: str | Path) -> None:
    """Load ``state`` into ``module``, refusing missing, unexpected or misshapen keys.

    A classifier head present in the file (``fc.*``, ``classifier.*``) is ignored
    because detectors drop it.
    """
    own = module.state_dict()
    head = ("fc.", "classifier.")
    state = {k: v for k, v in state.items() if k in own or not k.startswith(head)}
    # a features-only file (no classifier) is fine: detectors drop the classifier anyway
    missing = sorted(k for k in set(own) - set(state) if not k.startswith(head))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise WeightsError(
            f"backbone_weights: {path} does not match the backbone: "
            f"missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
            f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}"
        )
    bad = [k for k in state if not isinstance(state[k], torch.Tensor) or tuple(own[k].shape) != tuple(state[k].shape)]
    if bad:
        got = tuple(state[bad[0]].shape) if isinstance(state[bad[0]], torch.Tensor) else type(state[bad[0]]).__name__
        raise WeightsError(
            f"backbone_weights: {path}: shape mismatch at {bad[:3]} (file {got}, backbone {tuple(own[bad[0]].shape)})"
        )
    module.load_state_dict(state, strict=False)


def load_backbone_weights(module: nn.Module, path: str | Path) -> None:
    """Load a local state dict into ``module``, refusing files whose keys do not match."""
    load_state_checked(module, read_weights(path), path)


# ---------------------------------------------------------------------------
# ssd_tiny: a small VGG-style SSD for CPU studies (FIELD-NOTES "A tiny SSD")
class TinyVGGBackbone(nn.Module):
    """VGG-style 3x3 convs, each followed by BatchNorm (``batch_norm=True``, the default) and ReLU.

    Feature maps at strides 8/16/32/64, each feeding both the next stage and a
    multibox head: the branch structure adaptive scaling must handle.

    Why BatchNorm: without it the toy was bimodal. Over seeds 0-4 (fp32, 400
    iterations) two runs stalled on the start-up plateau (0.2 and 0.8 mAP) while
    the others reached 13-27. Normalising only the initial scale (each conv
    rescaled to unit output variance on a noise batch) did not help: seed 1
    still stalled (0.2 mAP at 800 iterations). With BatchNorm every seed learns,
    and at 800 iterations all five land within 2 mAP of their mean
    (docs/toy_model.md has the measurements). ``batch_norm=False`` restores the
    plain stack.
    """

    def __init__(self, width: int = 16, batch_norm: bool = True) -> None:
        super().__init__()
        w = width

        def conv(cin, cout, stride=1):
            if batch_norm:
                return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.ReLU(inplace=True)]

        self.stem = nn.Sequential(
            *conv(3, w),
            nn.MaxPool2d(2),
            *conv(w, 2 * w),
            nn.MaxPool2d(2),
            *conv(2 * w, 2 * w),
            nn.MaxPool2d(2),
            *conv(2 * w, 2 * w),
        )
        self.stage2 = nn.Sequential(*conv(2 * w, 4 * w, 2), *conv(4 * w, 4 * w))
        self.stage3 = nn.Sequential(*conv(4 * w, 4 * w, 2))
        self.stage4 = nn.Sequential(*conv(4 * w, 4 * w, 2))
        self.out_channels = [2 * w, 4 * w, 4 * w, 4 * w]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        f1 = self.stem(x)
        f2 = self.stage2(f1)
        f3 = self.stage3(f2)
        f4 = self.stage4(f3)
        return OrderedDict([("0", f1), ("1", f2), ("2", f3), ("3", f4)])


def ssd_tiny(
    num_classes: int, image_size: int = 128, width: int = 16, backbone_weights=None, batch_norm: bool = True, **kw
) -> SSD:
    backbone = TinyVGGBackbone(width, batch_norm=batch_norm)
    if backbone_weights:
        load_backbone_weights(backbone, backbone_weights)
    anchors = DefaultBoxGenerator([[2], [2, 3], [2, 3], [2]], min_ratio=0.1, max_ratio=0.9)
    return SSD(
        backbone,
        anchors,
        (image_size, image_size),
        num_classes,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.25, 0.25, 0.25],
        **kw,
    )


# ---------------------------------------------------------------------------
# VGG16 SSD300 / SSD512 as chainercv builds them (chainercv.links.model.ssd.ssd_vgg16):
# VGG16 with pool5 3x3/1, dilated conv6, conv7, L2Norm(conv4_3) with initial scale 20,
# extras conv8..conv11 (SSD512: conv8..conv12, all stride 2, conv12_2 4x4), Glorot-uniform
# extras and heads with zero bias; default boxes of chainercv's sizes, not clipped.
def _extra_block(cin: int, mid: int, cout: int, kernel: int, stride: int, padding: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, mid, kernel_size=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(mid, cout, kernel_size=kernel, stride=stride, padding=padding),
        nn.ReLU(inplace=True),
    )


def _glorot_zero(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class _VGG16Features(nn.Module):
    """torchvision's VGG16 without its classifier (same ``features.*`` keys and initialisation):
    the 100M-parameter classifier would only be built to be thrown away."""

    def __init__(self) -> None:
        super().__init__()
        self.features = make_vgg_layers(vgg_cfgs["D"], batch_norm=False)
        for m in self.features.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)


#: keys of conv6/conv7 in a backbone file (``lsbench weights convert`` writes them from the
#: fc-reduced VGG16): loaded into torchvision's extractor, ``extra.0.7.1`` / ``extra.0.7.3``
FC_REDUCED_KEYS = ("conv6.weight", "conv6.bias", "conv7.weight", "conv7.bias")


class _L2NormInput(nn.Identity):
    """Marks the L2Norm input: the authors' later SSD scales the gradient arriving there with its
    own statistics (``ada_loss_cast``; adaptive scaling's ``output_scaling``). An identity: no
    parameters, no state, the model computes exactly as before."""

    ada_output_point = "l2norm_input"
    ada_lognormal = False


class _VGGExtractor(SSDFeatureExtractorVGG):
    """torchvision's SSD VGG extractor with the L2Norm input passing through :class:`_L2NormInput`
    (same parameters and state-dict keys; torchvision's forward otherwise)."""

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        x = self.features(x)
        rescaled = self.scale_weight.view(1, -1, 1, 1) * F.normalize(self.l2norm_input(x))
        output = [rescaled]
        for block in self.extra:
            x = block(x)
            output.append(x)
        return OrderedDict([(str(i), v) for i, v in enumerate(output)])


def _vgg_backbone(highres: bool, backbone_weights) -> nn.Module:
    vgg = _VGG16Features()
    fc_state: dict = {}
    if backbone_weights:
        state = dict(read_weights(backbone_weights))
        fc_state = {k: state.pop(k) for k in FC_REDUCED_KEYS if k in state}
        load_state_checked(vgg, state, backbone_weights)
    # torchvision's extractor: conv4_3 -> L2Norm (scale_weight initialised to 20, as chainercv's
    # Normalize(initial=20)), pool5 3x3/1/1, conv6 3x3 dilation 6, conv7 1x1; pool3 in ceil mode
    # (chainercv pools with cover_all, i.e. ceil, everywhere: the same sizes at 300 and 512 px).
    extractor = _vgg_extractor(vgg, highres, trainable_layers=5)
    extractor.__class__ = _VGGExtractor
    extractor.l2norm_input = _L2NormInput()
    if highres:
        # chainercv VGG16Extractor512: conv10_2 and conv11_2 are 3x3 stride 2 pad 1, conv12_2 4x4 pad 1
        # (torchvision's highres variant uses 3x3 pad 0 and 4x4 pad 0: maps 6, 4, 1 instead of 4, 2, 1)
        extractor.extra[3] = _extra_block(256, 128, 256, 3, 2, 1)
        extractor.extra[4] = _extra_block(256, 128, 256, 3, 2, 1)
        extractor.extra[5] = _extra_block(256, 128, 256, 4, 1, 1)
        for i in (3, 4, 5):
            _glorot_zero(extractor.extra[i])
    if fc_state:
        # conv6 (3x3 dilation 6) and conv7 (1x1): the fc-reduced VGG16's subsampled fc6/fc7, as
        # chainercv's and the SSD paper's models start (else torchvision's Xavier init)
        fc = extractor.extra[0][-1]
        load_state_checked(
            fc, {k.replace("conv6.", "1.").replace("conv7.", "3."): v for k, v in fc_state.items()}, backbone_weights
        )
    # Declared, so torchvision does not probe the channels with a dummy forward.
    extractor.out_channels = [512, 1024, 512, 256, 256, 256] + ([256] if highres else [])
    return extractor


#: chainercv default-box sizes in pixels (SSD300 / SSD512) and feature-map steps
CHAINERCV_SSD300 = {
    "size": 300,
    "sizes": (30, 60, 111, 162, 213, 264, 315),
    "steps": (8, 16, 32, 64, 100, 300),
    "aspect_ratios": ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,)),
}
CHAINERCV_SSD512 = {
    "size": 512,
    "sizes": (35.84, 76.8, 153.6, 230.4, 307.2, 384.0, 460.8, 537.6),
    "steps": (8, 16, 32, 64, 128, 256, 512),
    "aspect_ratios": ((2,), (2, 3), (2, 3), (2, 3), (2, 3), (2,), (2,)),
}
#: NVIDIA SSD300 v1.1 / MLPerf SSD-ResNet34 dboxes300_coco: scales in pixels, boxes clamped to the image
DBOXES300_COCO = {
    "size": 300,
    "sizes": (21, 45, 99, 153, 207, 261, 315),
    "steps": (8, 16, 32, 64, 100, 300),
    "aspect_ratios": ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,)),
}


class ClampedBoxGenerator(DefaultBoxGenerator):
    """NVIDIA's / MLPerf's ``DefaultBoxes``: centre *and* size clamped to [0, 1] (torchvision's
    ``clip`` clamps the sizes only; with steps 32 on a 10x10 map at 300 px the last centres
    would lie at 1.013)."""

    def _grid_default_boxes(self, grid_sizes, image_size, dtype=torch.float32):
        return super()._grid_default_boxes(grid_sizes, image_size, dtype).clamp(0, 1)


def _anchors(cfg: dict, image_size: int, clip: bool) -> DefaultBoxGenerator:
    """Default boxes of ``cfg``; at its nominal size the centres follow its steps (as the reference),
    at any other size they follow the feature-map grid (steps would no longer match the maps).
    ``clip``: clamp centres and sizes to the image, as NVIDIA's/MLPerf's dboxes (chainercv: no clip)."""
    scales = [s / cfg["size"] for s in cfg["sizes"]]
    steps = list(cfg["steps"]) if int(image_size) == cfg["size"] else None
    cls = ClampedBoxGenerator if clip else DefaultBoxGenerator
    return cls([list(a) for a in cfg["aspect_ratios"]], scales=scales, steps=steps, clip=clip)


def ssd300_vgg16(num_classes: int, image_size: int = 300, backbone_weights=None, **kw) -> SSD:
    """chainercv SSD300: 8732 default boxes of sizes 30..315 px (not clipped)."""
    return SSD(
        _vgg_backbone(False, backbone_weights),
        _anchors(CHAINERCV_SSD300, image_size, clip=False),
        (image_size, image_size),
        num_classes,
        image_mean=_VGG_MEAN,
        image_std=_VGG_STD,
        **kw,
    )


def ssd512_vgg16(num_classes: int, image_size: int = 512, backbone_weights=None, **kw) -> SSD:
    """chainercv SSD512: 24564 default boxes of sizes 35.84..537.6 px on maps 64, 32, 16, 8, 4, 2, 1."""
    return SSD(
        _vgg_backbone(True, backbone_weights),
        _anchors(CHAINERCV_SSD512, image_size, clip=False),
        (image_size, image_size),
        num_classes,
        image_mean=_VGG_MEAN,
        image_std=_VGG_STD,
        **kw,
    )


# ---------------------------------------------------------------------------
# ResNet SSD300: MLPerf SSD-ResNet34 and NVIDIA SSD300 v1.1 (ResNet-50)
def _torch_default_then_xavier(module: nn.Module) -> None:
    """The references' ``_init_weights``: Xavier-uniform weights, PyTorch's default bias init."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            m.reset_parameters()
            nn.init.xavier_uniform_(m.weight)


class ResNetSSDBackbone(nn.Module):
    """ResNet up to layer3 with layer3's stride removed (38x38 at 300 px), then the SSD extra blocks.

    Both references (NVIDIA ``ssd/model.py``, MLPerf ``ssd300.py`` + ``base_model.py``) keep
    ``conv1 .. layer3`` of the torchvision ResNet, set the first layer3 block's strides to 1
    (conv1 and conv2 and the downsample), and add five extra blocks (1x1 conv to 256, 256, 128,
    128, 128 channels, then a 3x3 conv: stride 2 pad 1 for the first three, pad 0 for the last
    two) giving maps 38, 19, 10, 5, 3, 1 with channels [C3, 512, 512, 256, 256, 256].
    ``batch_norm=True`` (NVIDIA v1.1): bias-free convs each followed by BatchNorm.
    ``batch_norm=False`` (MLPerf reference): convs with bias, no BatchNorm.
    """

    def __init__(self, resnet: nn.Module, *, batch_norm: bool) -> None:
        super().__init__()
        self.features = nn.Sequential(
            resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool, resnet.layer1, resnet.layer2, resnet.layer3
        )
        block = resnet.layer3[0]
        for name in ("conv1", "conv2"):
            getattr(block, name).stride = (1, 1)
        if block.downsample is not None:
            block.downsample[0].stride = (1, 1)
        last = resnet.layer3[-1]
        c3 = (last.conv3 if hasattr(last, "conv3") else last.conv2).out_channels
        chans = [c3, 512, 512, 256, 256, 256]
        mids = [256, 256, 128, 128, 128]
        extra = []
        for i, (cin, mid, cout) in enumerate(zip(chans[:-1], mids, chans[1:])):
            stride, pad = (2, 1) if i < 3 else (1, 0)
            if batch_norm:
                layers = [
                    nn.Conv2d(cin, mid, 1, bias=False),
                    nn.BatchNorm2d(mid),
                    nn.ReLU(inplace=True),
                    nn.Conv2d(mid, cout, 3, stride=stride, padding=pad, bias=False),
                    nn.BatchNorm2d(cout),
                    nn.ReLU(inplace=True),
                ]
            else:
                layers = [
                    nn.Conv2d(cin, mid, 1),
                    nn.ReLU(inplace=True),
                    nn.Conv2d(mid, cout, 3, stride=stride, padding=pad),
                    nn.ReLU(inplace=True),
                ]
            extra.append(nn.Sequential(*layers))
        self.extra = nn.ModuleList(extra)
        _torch_default_then_xavier(self.extra)
        self.out_channels = chans

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        x = self.features(x)
        out = [x]
        for block in self.extra:
            x = block(x)
            out.append(x)
        return OrderedDict((str(i), v) for i, v in enumerate(out))


def _resnet_ssd300(
    factory: Callable[[], nn.Module], num_classes: int, image_size: int, backbone_weights, batch_norm: bool, **kw
):
    resnet = factory()
    if backbone_weights:
        load_backbone_weights(resnet, backbone_weights)
    # dboxes300_coco, clamped to [0, 1] like the references' DefaultBoxes; ImageNet mean/std inputs
    model = SSD(
        ResNetSSDBackbone(resnet, batch_norm=batch_norm),
        _anchors(DBOXES300_COCO, image_size, clip=True),
        (image_size, image_size),
        num_classes,
        **kw,
    )
    _torch_default_then_xavier(model.head)
    return model


def ssd300_resnet34(num_classes: int, image_size: int = 300, backbone_weights=None, **kw) -> SSD:
    """MLPerf SSD-ResNet34 (training reference v0.5-v0.7, the base of Habana's seed-003 model):
    extra blocks with bias and no BatchNorm."""
    return _resnet_ssd300(resnet34, num_classes, image_size, backbone_weights, batch_norm=False, **kw)


def ssd300_resnet50(num_classes: int, image_size: int = 300, backbone_weights=None, **kw) -> SSD:
    """NVIDIA SSD300 v1.1 (DeepLearningExamples): ResNet-50 to layer3, BatchNorm extra blocks."""
    return _resnet_ssd300(resnet50, num_classes, image_size, backbone_weights, batch_norm=True, **kw)
