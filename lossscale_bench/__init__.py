"""lossscale_bench: mixed-precision loss-scaling studies of SSD object detectors.

Heavy dependencies (torch, ray, mlflow) are imported by the modules that need
them, never here, so that ``lsbench validate`` and ``--help`` stay instant: the
public factory (``create_scaler``, ``create_precision``, ``layer_telemetry``,
:mod:`lossscale_bench.library`) is imported on first use.

Floors. Each module imports only from its own floor or the floors below, with no circle: the floors,
bottom to top, and the reason for each are ``FLOORS`` in ``tests/test_structure.py``, which checks them
on the import graph (with the limits on module and function length and on shared underscore names);
docs/development/architecture.md says what each package and module holds.
"""

#: the package's version: pyproject.toml reads it from here; CHANGELOG.md's newest section names it
__version__ = "0.2.0"

__all__ = ["LayerTelemetry", "create_precision", "create_scaler", "layer_telemetry"]


def __getattr__(name: str):
    """``lossscale_bench.create_scaler`` and the rest of ``__all__``, imported (with torch) on first use."""
    if name in __all__:
        from . import library

        return getattr(library, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
