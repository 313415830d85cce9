"""Fixed names that study files may use, kept free of heavy imports.

Study validation (``lsbench validate``) must not import torch, Ray or MLflow. The names of the
plug-ins (models, scaling methods, precisions, data sets) are not here: each is registered where it
is described (:mod:`lossscale_bench.core.plugins`; ``lossscale_bench.study.plugins`` lists them).
"""

DYNAMIC_STYLES = ("chainer", "torch", "deepspeed")
AMAX_RECIPES = ("current", "delayed")
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
