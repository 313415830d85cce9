"""The sink interface lives in the engine package, whose loop imports torch; the tracking package
subclasses the sink, and ``lsbench report`` imports tracking: neither may pull torch in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_sink_and_the_tracking_package_import_without_torch():
    code = (
        "import sys; import lossscale_bench.engine.sink, lossscale_bench.tracking, lossscale_bench.report; "
        "bad = [m for m in ('torch', 'ray') if m in sys.modules]; assert not bad, bad; "
        "from lossscale_bench.engine import Trainer; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
