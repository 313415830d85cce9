"""Contradictory scaler options are refused at validation, naming the field."""

from __future__ import annotations

import pytest

from helpers import one_entry_study
from lossscale_bench.study import StudyError, load_study_text


@pytest.mark.parametrize(
    "entry,path,words",
    [
        ("{method: layerwise_dynamic, min_scale: 1000, max_scale: 10}", "scaling[0].min_scale", "above max_scale"),
        ("{method: layerwise_dynamic, init_scale: 8, min_scale: 16}", "scaling[0].init_scale", "below min_scale"),
        ("{method: layerwise_dynamic, max_scale: 1024}", "scaling[0].init_scale", "above max_scale"),
        (
            "{method: dynamic, style: deepspeed, init_scale: 1, min_scale: 65536}",
            "scaling[0].init_scale",
            "below min_scale",
        ),
        (
            "{method: adaptive, init_scale: 2048, accum_upper_bound: 1}",
            "scaling[0].init_scale",
            "above accum_upper_bound",
        ),
        ("{method: dynamic, style: torch, hysteresis: 2}", "scaling[0].hysteresis", "style: deepspeed"),
        ("{method: amax, recipe: current, history: 8}", "scaling[0].history", "recipe: delayed"),
    ],
)
def test_contradictory_options_are_refused(entry, path, words):
    with pytest.raises(StudyError) as err:
        load_study_text(one_entry_study(entry), source="x.yaml")
    text = str(err.value)
    assert text.startswith(f"x.yaml: {path}: ") and words in text and "\n" not in text


@pytest.mark.parametrize(
    "entry",
    [
        "{method: layerwise_dynamic, init_scale: 64, min_scale: 1, max_scale: 1024}",
        "{method: dynamic, style: deepspeed, init_scale: 65536, min_scale: 1}",
        "{method: adaptive, init_scale: 1024, accum_upper_bound: 1024}",
    ],
)
def test_consistent_bounds_pass(entry):
    load_study_text(one_entry_study(entry), source="x.yaml")
