"""Shared test fixtures: every test writes under its tmp_path, never into ~ or the checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# tests/helpers.py is importable as ``helpers`` from every test file, in any pytest import mode
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from servers import mlflow_server, postgres, reference  # noqa: E402,F401  (session fixtures: the team's servers)

from helpers import BASE_STUDY, study_yaml, write_study  # noqa: E402,F401  (the study builder)


@pytest.fixture
def study_file(tmp_path):
    """``study_file(**overrides)``: ``write_study(tmp_path, **overrides)``, the study's path."""
    return lambda name="s.yaml", **overrides: write_study(tmp_path, name, **overrides)


@pytest.fixture(scope="session", autouse=True)
def _isolated_data_cache(tmp_path_factory):
    """Synthetic datasets go to a per-session cache, not ~/.cache."""
    cache = tmp_path_factory.mktemp("lsbench-data")
    old = os.environ.get("LSBENCH_DATA")
    os.environ["LSBENCH_DATA"] = str(cache)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield cache
    if old is None:
        os.environ.pop("LSBENCH_DATA", None)
    else:
        os.environ["LSBENCH_DATA"] = old


@pytest.fixture(autouse=True)
def _torch_threads():
    """Tests share 2 cores; one intra-op thread keeps timings sane when Ray trials run beside."""
    try:
        import torch

        n = torch.get_num_threads()
        torch.set_num_threads(min(n, 2))
        yield
        torch.set_num_threads(n)
    except ImportError:
        yield
