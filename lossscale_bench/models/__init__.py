"""Detector builders: the SSDs (``ssd.py``) and torchvision's one-stage detectors (``torchvision_detectors.py``)."""

from ..core.registry import MODEL_NAMES
from . import torchvision_detectors as _tv
from .ssd import BUILDERS, build_model

BUILDERS.update(
    {
        "ssdlite320_mobilenet_v3_large": _tv.ssdlite320_mobilenet_v3_large,
        "retinanet_resnet50_fpn_v2": _tv.retinanet_resnet50_fpn_v2,
        "fcos_resnet50_fpn": _tv.fcos_resnet50_fpn,
    }
)
assert tuple(BUILDERS) == MODEL_NAMES

__all__ = ["BUILDERS", "build_model"]
