"""The sections of ``benchmarks/gpu_check.py``, one module each (``scaler_match``: a and h; ``throughput``: b;
``adaptive``: c; ``probe``: d and g; ``short_run``: e; ``memory``: f), what they share (``common``) and the
markdown (``render``). Imported with ``benchmarks/`` on the path, as ``gpu_check.py`` puts it."""
