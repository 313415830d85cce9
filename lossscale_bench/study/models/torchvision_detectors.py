"""torchvision's one-stage detectors of ``lossscale_bench/models/torchvision_detectors.py``, described for
study files (torch-free)."""

from __future__ import annotations

from ...core.plugins import Option
from . import register_model
from .ssd import SSD_OPTIONS

_WEIGHTS = Option(
    "backbone_weights",
    "path",
    None,
    None,
    "Backbone state dict (torchvision's MobileNetV3-Large or ResNet-50 keys); relative to the study file.",
)


def _image_size(default: int, what: str) -> Option:
    return Option("image_size", "int", default, None, f"Input size in pixels ({what}).")


register_model(
    "ssdlite320_mobilenet_v3_large",
    "lossscale_bench.models.torchvision_detectors:ssdlite320_mobilenet_v3_large",
    display="SSDlite320-MobileNetV3",
    doc="torchvision's SSDlite320 on MobileNetV3-Large (depthwise convolutions, BatchNorm), random init.",
    options=(
        _image_size(320, "the fixed square size"),
        Option("width_mult", "float", 1.0, None, "MobileNetV3's channel multiplier for backbone and extras."),
        *SSD_OPTIONS,
    ),
)
register_model(
    "retinanet_resnet50_fpn_v2",
    "lossscale_bench.models.torchvision_detectors:retinanet_resnet50_fpn_v2",
    display="RetinaNet-R50-FPN v2",
    doc="torchvision's RetinaNet v2: ResNet-50, FPN, GroupNorm heads, focal loss; labels 1..K.",
    options=(_image_size(800, "torchvision's min_size and max_size"), _WEIGHTS),
)
register_model(
    "fcos_resnet50_fpn",
    "lossscale_bench.models.torchvision_detectors:fcos_resnet50_fpn",
    display="FCOS-R50-FPN",
    doc="torchvision's FCOS: ResNet-50, FPN, GroupNorm heads, focal loss, centre-ness; labels 1..K.",
    options=(_image_size(800, "torchvision's min_size and max_size"), _WEIGHTS),
)
