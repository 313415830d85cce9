"""Detection metrics: COCO box mAP (pycocotools)."""

from .coco import evaluate_coco, evaluate_detections

__all__ = ["evaluate_coco", "evaluate_detections"]
