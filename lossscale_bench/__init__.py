"""lossscale_bench: mixed-precision loss-scaling studies of SSD object detectors.

Heavy dependencies (torch, ray, mlflow) are imported by the modules that need
them, never here, so that ``lsbench validate`` and ``--help`` stay instant.

Floors. Each module imports only from its own floor or the floors below, with no circle: the floors,
bottom to top, and the reason for each are ``FLOORS`` in ``tests/test_structure.py``, which checks them
on the import graph (with the limits on module and function length and on shared underscore names);
docs/development/architecture.md says what each package and module holds.
"""

#: the package's version: pyproject.toml reads it from here; CHANGELOG.md's newest section names it
__version__ = "0.2.0"
