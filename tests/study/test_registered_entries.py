"""Every registered scaling method and precision trains: the tests a new entry gets with no edit here.

Why: the registry (``registry.SCALING_METHODS``, ``registry.PRECISIONS``) and the entries behind it
are the only place a method or a precision is described (README "Adding a method or a precision").
These tests take their lists from there, so a new method or precision is exercised the day it is
registered: a short trial (the tiny synthetic SSD, 3 steps) through ``run_trial`` must not fail, must
log its loss scale every step and, for a per-layer method, the layer-scale metric ``lsbench report
--telemetry`` reads. Each method trains in two precisions: a scaled emulation with fp16's range, and
E4M3 gradients, whose 448 maximum saturates instead of overflowing (a scaler that waits for an
overflow sees none; finishing or diverging is a result there, an error is not). What the method
computes is its own test's business (tests/scaling/); that each precision rounds to the formats its
entry names is tests/study/test_precision_entries.py's.
"""

from __future__ import annotations

import math

import pytest

from helpers import study_yaml
from lossscale_bench.core.registry import LAYER_SCALE_SUFFIX
from lossscale_bench.study import load_study_text
from lossscale_bench.study.methods import ENTRIES
from lossscale_bench.study.methods import METHOD_NAMES as SCALING_METHODS
from lossscale_bench.study.precisions import PRECISION_NAMES as PRECISIONS
from lossscale_bench.study.precisions import PRECISION_SPECS

#: the precision the methods are tried in: the first emulated one whose gradients need a loss scale
#: (CPU-speed, and every method then has overflow and underflow to act on)
SCALED_EMULATION = next(n for n, s in PRECISION_SPECS.items() if s.emulated and s.needs_scaler)
#: the emulation with E4M3 gradients, element-wise (no block scale)
E4M3_GRADS = next(
    n for n, s in PRECISION_SPECS.items() if s.emulated and s.grad_format == "e4m3" and not s.grad_scaling
)
STEPS = 3


def _trial(tmp_path, precision: str, entry: str):
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.trial import run_trial

    cfg = load_study_text(
        study_yaml(
            precision=precision,
            scaling=[entry],
            log_every=1,
            schedule={"iterations": STEPS, "lr": 0.01, "warmup_iterations": 1},
        )
    ).trials()[0]
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=tmp_path, threads=1)
    # diverged is a result (a default start scale may overflow every one of 3 steps), failed is a bug
    assert out.status in ("finished", "diverged"), (entry, precision, out.error)
    scales = sink.history("loss_scale")
    assert [s for s, _ in scales] == list(range(1, STEPS + 1)), (entry, precision, scales)
    assert all(v > 0 and math.isfinite(v) for _, v in scales), scales
    return sink


@pytest.mark.parametrize("precision", [SCALED_EMULATION, E4M3_GRADS])
@pytest.mark.parametrize("method", SCALING_METHODS)
def test_every_method_trains_at_its_defaults(tmp_path, method, precision):
    sink = _trial(tmp_path, precision, f"{{method: {method}}}")
    layer_scales = {k for k, _, _ in sink.items if k.endswith(LAYER_SCALE_SUFFIX)}
    if ENTRIES[method].per_layer:  # what report --telemetry shows as the row's layer scale
        assert layer_scales, f"{method} logs no metric ending in {LAYER_SCALE_SUFFIX}"
        assert all(math.isfinite(v) for k, v, _ in sink.items if k in layer_scales)
    else:
        assert not layer_scales, layer_scales


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_trains(tmp_path, precision):
    """With a fixed loss scale where the precision's gradients need one, else with none."""
    entry = "{method: fixed, scale: 128}" if PRECISION_SPECS[precision].needs_scaler else "{method: none}"
    sink = _trial(tmp_path, precision, entry)
    want = 128.0 if PRECISION_SPECS[precision].needs_scaler else 1.0
    assert {v for _, v in sink.history("loss_scale")} == {want}


# ------------------------------------------------------------------------------------ every option has a doc
def undocumented(plugin) -> list[str]:
    """The options of a registered plug-in without a one-line doc (the reference pages would show "—")."""
    return [o.name for o in plugin.options if not (o.doc or "").strip()]


@pytest.mark.parametrize("kind", ["model", "method", "precision", "dataset"])
def test_every_option_of_every_plugin_has_a_doc(kind):
    from lossscale_bench.study import plugins

    missing = {p.name: undocumented(p) for p in plugins.entries(kind) if undocumented(p)}
    assert not missing, f"options without a doc (a #: comment above the field): {missing}"


def test_an_option_without_a_doc_is_caught():
    """The mistake as the recipe's reader makes it: a new option with no ``#:`` comment above it."""
    from typing import Literal

    from lossscale_bench.study.fields import number_field
    from lossscale_bench.study.methods.base import MethodEntry, method_plugin

    class Undocumented(MethodEntry):
        method: Literal["undocumented"]
        #: documented
        alpha: number_field("int", ge=0) = 1  # type: ignore[valid-type]
        beta: number_field("int", ge=0) = 2  # type: ignore[valid-type]
        scaler = "lossscale_bench.scaling.fixed:FixedLossScaler"

    plugin = method_plugin(Undocumented)
    assert plugin.option("alpha").doc == "documented"
    assert undocumented(plugin) == ["beta"]
