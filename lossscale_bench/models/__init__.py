"""Detector builders; see ``ssd.py``."""

from .ssd import BUILDERS, build_model

__all__ = ["BUILDERS", "build_model"]
