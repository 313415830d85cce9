"""lossscale_bench: mixed-precision loss-scaling studies of SSD object detectors.

Heavy dependencies (torch, ray, mlflow) are imported by the modules that need
them, never here, so that ``lsbench validate`` and ``--help`` stay instant.
"""

__version__ = "0.1.0"
