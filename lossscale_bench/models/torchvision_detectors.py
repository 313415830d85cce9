"""torchvision's one-stage detectors as study models: SSDlite, RetinaNet v2 and FCOS.

Nothing is downloaded: each starts from random initialisation (torchvision's builders with
``weights=None, weights_backbone=None``), or loads its backbone (MobileNetV3-Large, ResNet-50) from
a local state dict (``backbone_weights``, checked by key as the SSDs' are: :func:`.ssd.load_backbone_weights`).

Classes: ``num_classes`` counts the background class, as for the SSDs (the project's datasets label
objects 1..K and pass ``K + 1``). SSDlite's softmax uses column 0 as background; RetinaNet and FCOS
score every column with a sigmoid (focal loss) and have no background class, so column 0 is never a
target and is trained towards zero, exactly as torchvision's COCO models, which have 91 columns
for labels 1..90. Their predictions of label 0 are dropped (:class:`_NoBackgroundDetections`), so
every returned label lies in 1..K.

Input size: SSDlite is fixed at 320 x 320 in torchvision and refuses ``size=``; here its transform's
``fixed_size``/``min_size``/``max_size`` are set to ``image_size``. RetinaNet and FCOS resize an image
so its short side is ``min_size`` and its long side at most ``max_size``; both are ``image_size`` here,
so a square image is trained at ``image_size`` x ``image_size``.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torchvision.models import detection as tv_detection
from torchvision.models import mobilenet_v3_large
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
from torchvision.models.detection.fcos import FCOS
from torchvision.models.detection.retinanet import RetinaNet
from torchvision.models.detection.ssd import SSD
from torchvision.models.detection.ssdlite import SSDLiteHead, _mobilenet_extractor, _normal_init

from .ssd import load_backbone_weights

__all__ = [
    "FCOSLabels",
    "RetinaNetLabels",
    "fcos_resnet50_fpn",
    "retinanet_resnet50_fpn_v2",
    "ssdlite320_mobilenet_v3_large",
]


def ssdlite320_mobilenet_v3_large(
    num_classes: int, *, image_size: int = 320, backbone_weights: str | None = None, width_mult: float = 1.0, **kw
) -> SSD:
    """torchvision's SSDlite320 (MobileNetV3-Large, depthwise convolutions, BatchNorm), built as
    ``ssdlite320_mobilenet_v3_large`` builds it, at ``image_size`` pixels and ``width_mult`` channels.

    ``width_mult`` scales the backbone's and the extra layers' channels (MobileNetV3's own switch;
    1.0 is torchvision's model, parameter for parameter). ``backbone_weights``: a MobileNetV3-Large
    state dict (``features.*``; the ImageNet classifier is ignored); then, as torchvision with ImageNet
    weights, the backbone keeps its full tail (``reduced_tail=False``) and its initialisation.
    """
    norm_layer = partial(nn.BatchNorm2d, eps=0.001, momentum=0.03)
    backbone = mobilenet_v3_large(
        weights=None, norm_layer=norm_layer, reduced_tail=not backbone_weights, width_mult=width_mult
    )
    if backbone_weights:
        load_backbone_weights(backbone, backbone_weights)
    else:
        _normal_init(backbone)  # torchvision's initialisation when no backbone is pretrained
    features = _mobilenet_extractor(backbone, 6, norm_layer)
    if width_mult != 1.0:  # the extra layers follow the backbone's width (torchvision: always 1.0)
        c4_pos = [i for i, b in enumerate(backbone.features) if getattr(b, "_is_cn", False)][-1]
        features = type(features)(backbone.features, c4_pos, norm_layer, width_mult=width_mult)
    size = (int(image_size), int(image_size))
    anchors = DefaultBoxGenerator([[2, 3] for _ in range(6)], min_ratio=0.2, max_ratio=0.95)
    out_channels = det_utils.retrieve_out_channels(features, size)
    defaults = {
        "score_thresh": 0.001,
        "nms_thresh": 0.55,
        "detections_per_img": 300,
        "topk_candidates": 300,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    head = SSDLiteHead(out_channels, anchors.num_anchors_per_location(), num_classes, norm_layer)
    return SSD(features, anchors, size, num_classes, head=head, **{**defaults, **kw})


class _NoBackgroundDetections:
    """Mixin for RetinaNet/FCOS: drop detections of label 0 (the unused background column)."""

    def postprocess_detections(self, *args, **kwargs):
        out = super().postprocess_detections(*args, **kwargs)
        for det in out:
            keep = det["labels"] != 0
            for key in ("boxes", "scores", "labels"):
                det[key] = det[key][keep]
        return out


class RetinaNetLabels(_NoBackgroundDetections, RetinaNet):
    """torchvision's RetinaNet, returning labels 1..K only (same parameters and state dict)."""


class FCOSLabels(_NoBackgroundDetections, FCOS):
    """torchvision's FCOS, returning labels 1..K only (same parameters and state dict)."""


def _one_stage(build, cls, num_classes: int, image_size: int, backbone_weights: str | None, kw: dict) -> nn.Module:
    size = int(image_size)
    model = build(weights=None, weights_backbone=None, num_classes=num_classes, min_size=size, max_size=size, **kw)
    if backbone_weights:
        # the ResNet-50 inside the FPN extractor: conv1, bn1, layer1..4 with torchvision's keys
        load_backbone_weights(model.backbone.body, backbone_weights)
    model.__class__ = cls
    return model


def retinanet_resnet50_fpn_v2(
    num_classes: int, *, image_size: int = 800, backbone_weights: str | None = None, **kw
) -> RetinaNet:
    """torchvision's RetinaNet v2: ResNet-50 with BatchNorm, FPN P3-P7, GroupNorm heads, sigmoid focal
    loss and GIoU box loss, trained at ``image_size`` (torchvision's ``min_size``/``max_size``)."""
    return _one_stage(
        tv_detection.retinanet_resnet50_fpn_v2, RetinaNetLabels, num_classes, image_size, backbone_weights, kw
    )


def fcos_resnet50_fpn(num_classes: int, *, image_size: int = 800, backbone_weights: str | None = None, **kw) -> FCOS:
    """torchvision's FCOS: ResNet-50 with BatchNorm, FPN P3-P7, GroupNorm heads, sigmoid focal loss,
    GIoU box loss and centre-ness, anchor-free, trained at ``image_size``."""
    return _one_stage(tv_detection.fcos_resnet50_fpn, FCOSLabels, num_classes, image_size, backbone_weights, kw)
