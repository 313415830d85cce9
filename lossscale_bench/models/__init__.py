"""Detector builders (``ssd.py``: the SSDs) and :func:`build_model`, which builds any name a study may use
(``build.py``; the names and options are described in ``lossscale_bench/study/models/``)."""

from .build import build_model, builder_of, detector_problem

__all__ = ["build_model", "builder_of", "detector_problem"]
