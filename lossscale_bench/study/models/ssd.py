"""The SSD detectors of ``lossscale_bench/models/ssd.py``, described for study files (torch-free)."""

from __future__ import annotations

from ...core.plugins import Option
from . import register_model

#: every SSD's options besides its own (``build_model`` reads ``batched_loss``)
SSD_OPTIONS = (
    Option(
        "backbone_weights",
        "path",
        None,
        None,
        "Backbone weights file (lsbench weights convert); relative to the study file.",
    ),
    Option(
        "batched_loss",
        "bool",
        None,
        (True, False),
        "true: the batched multibox loss, false: torchvision's per-image loop (not given: batched on "
        "accelerators, torchvision's on the CPU backend).",
    ),
)


def _image_size(default: int) -> Option:
    return Option(
        "image_size", "int", default, None, "Input size in pixels (the side of the square the images are resized to)."
    )


register_model(
    "ssd_tiny",
    "lossscale_bench.models.ssd:ssd_tiny",
    display="SSD-tiny",
    # 2: BatchNorm after every backbone conv (docs/development/toy-model.md)
    version=2,
    doc="A small VGG-style SSD for CPU studies (4 feature maps, strides 8 to 64).",
    options=(
        _image_size(128),
        Option("width", "int", 16, None, "Channel width of the backbone's first stage."),
        Option("batch_norm", "bool", True, (True, False), "BatchNorm after each backbone conv."),
        *SSD_OPTIONS,
    ),
)
register_model(
    "ssd300_vgg16",
    "lossscale_bench.models.ssd:ssd300_vgg16",
    display="SSD300",
    doc="chainercv's SSD300 on VGG16 (8732 default boxes).",
    options=(_image_size(300), *SSD_OPTIONS),
)
register_model(
    "ssd512_vgg16",
    "lossscale_bench.models.ssd:ssd512_vgg16",
    display="SSD512",
    doc="chainercv's SSD512 on VGG16 (24564 default boxes).",
    options=(_image_size(512), *SSD_OPTIONS),
)
register_model(
    "ssd300_resnet34",
    "lossscale_bench.models.ssd:ssd300_resnet34",
    display="SSD300-R34",
    doc="MLPerf's SSD-ResNet34 (training reference v0.5-v0.7).",
    options=(_image_size(300), *SSD_OPTIONS),
)
register_model(
    "ssd300_resnet50",
    "lossscale_bench.models.ssd:ssd300_resnet50",
    display="SSD300-R50",
    doc="NVIDIA's SSD300 v1.1 on ResNet-50 (DeepLearningExamples).",
    options=(_image_size(300), *SSD_OPTIONS),
)
