"""Names that study files may use, kept free of heavy imports.

Study validation (``lsbench validate``) must not import torch, Ray or MLflow,
so the sets of allowed names live here and the implementing modules check
themselves against them in the tests.
"""

MODEL_NAMES = (
    "ssd_tiny",
    "ssd300_vgg16",
    "ssd512_vgg16",
    "ssd300_resnet34",
    "ssd300_resnet50",
    # torchvision's one-stage detectors (models/torchvision_detectors.py)
    "ssdlite320_mobilenet_v3_large",
    "retinanet_resnet50_fpn_v2",
    "fcos_resnet50_fpn",
)
SCALING_METHODS = ("none", "fixed", "dynamic", "adaptive", "layerwise_dynamic", "amax", "saturation")
DYNAMIC_STYLES = ("chainer", "torch", "deepspeed")
AMAX_RECIPES = ("current", "delayed")
PRECISIONS = (
    "fp32",
    "mixed16",
    "bf16",
    "fp16-emulated",
    "fp8-emulated",
    "fp8-e4m3-emulated",
    # FP4 emulations: forward values in E4M3 or NVFP4, gradients in plain E2M1, NVFP4 or MXFP4
    "e4m3fwd-e2m1grad-emulated",
    "e4m3fwd-nvfp4grad-emulated",
    "e4m3fwd-mxfp4grad-emulated",
    "nvfp4fwd-e2m1grad-emulated",
    "nvfp4fwd-nvfp4grad-emulated",
    "nvfp4fwd-mxfp4grad-emulated",
)
DATASET_NAMES = ("synthetic", "voc", "voc0712", "coco2017")
BACKEND_NAMES = ("cpu", "cuda", "xla", "hpu", "auto")
EVAL_METRICS = ("coco", "voc07", "voc")

# A per-layer scaler (scaling/per_layer/scaler.py) logs its layers' median log2 scale under a metric whose name
# ends in this (``ada_scale_log2_median``, ``amax_point_scale_log2_median``); ``lsbench report
# --telemetry`` finds a method's layer scales by it, so the report names no method and a new per-layer
# method shows its scales with no edit there. A point scaler logs two (its points' absolute scales,
# ``<prefix>point_scale_log2_median``, and its layers' factors, ``<prefix>scale_log2_median``): the report takes
# the first name in sorted order, the points'. Here because both sides read it and neither imports the other.
LAYER_SCALE_SUFFIX = "scale_log2_median"

# The equivalence margins (mAP points) a report can test at: ``report.equivalence_margin`` in a study file,
# ``lsbench report --margin``. mAP lies in [0, 100] points, so a wider margin calls any two rows equivalent, and
# below a millionth of a point no run-to-run difference is resolved (the statistics' numbers would underflow).
# Here because the study file's checks and the report both read it and neither imports the other.
EQUIVALENCE_MARGIN_RANGE = (1e-6, 100.0)

# Bumped when a model's architecture or initialisation changes what it trains to, so that
# trial ids (and with them resume and the report) never mix results of the old and new model.
# ssd_tiny 2: BatchNorm after every backbone conv (docs/toy_model.md).
MODEL_VERSIONS = {"ssd_tiny": 2}
# The same for a scaling method whose implementation changed what a trial trains to (none yet):
# bump its entry (start at 2) and only that method's trial ids change.
METHOD_VERSIONS: dict[str, int] = {}

# The 20 PASCAL VOC classes in the devkit's order (label i is VOC_CLASSES[i - 1]); a voc0712
# study's default ``dataset.classes``. Here, not in ``data``: importing ``lossscale_bench.data``
# imports torch, and study validation must not (nor may the schema layer import a component).
VOC_CLASSES = (
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)
