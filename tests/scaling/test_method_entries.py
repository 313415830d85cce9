"""Each method's study entry and its scaler agree: the entry's defaults are the constructor's.

The defaults are written twice on purpose (the study layer is torch-free, the scaler must be
usable without a study), so this test is what keeps them one truth: a scaler built from an
entry left at its defaults must be the very scaler its constructor builds with no options.
"""

from __future__ import annotations

import inspect

import pytest
from torch import nn

from lossscale_bench.core.registry import DYNAMIC_STYLES
from lossscale_bench.scaling import build_scaler, scaler_class
from lossscale_bench.study.methods import ENTRIES
from lossscale_bench.study.methods import METHOD_NAMES as SCALING_METHODS


def _model():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1))


def _settings(scaler) -> dict:
    """The scaler's scalar settings (scale, interval, bounds, flags), what decides its behaviour."""
    return {k: v for k, v in vars(scaler).items() if isinstance(v, (bool, int, float, str)) and not k.startswith("__")}


def _entry_cases():
    for method in SCALING_METHODS:
        if method == "dynamic":
            for style in DYNAMIC_STYLES:
                yield method, {"style": style}, {"style": style}
        else:
            yield method, {}, {}


@pytest.mark.parametrize("method,given,ctor_args", list(_entry_cases()))
def test_entry_defaults_build_the_constructor_default_scaler(method, given, ctor_args):
    entry = ENTRIES[method].model_validate({"method": method, **given})
    cls = scaler_class(ENTRIES[method].scaler)
    if ENTRIES[method].per_layer:
        from_entry, plain = build_scaler(entry.normalized(), _model()), cls(_model(), **ctor_args)
    else:
        from_entry, plain = build_scaler(entry.normalized()), cls(**ctor_args)
    assert type(from_entry) is cls
    assert _settings(from_entry) == _settings(plain)
    for s in (from_entry, plain):
        s.remove()


@pytest.mark.parametrize("method", SCALING_METHODS)
def test_entry_option_defaults_equal_constructor_signature_defaults(method):
    """Where the constructor names a concrete default, the entry's default is the same value."""
    entry = ENTRIES[method]
    sig = inspect.signature(scaler_class(entry.scaler).__init__).parameters
    checked = 0
    for name in entry.option_names():
        field_default = entry.model_fields[name].default
        if (
            name in sig
            and sig[name].default is not inspect.Parameter.empty
            and sig[name].default is not None
            and field_default is not None
        ):
            assert field_default == sig[name].default, (method, name)
            checked += 1
    if method not in ("none", "dynamic"):  # dynamic's defaults depend on the style (the test above)
        assert checked, f"{method}: no option of the entry is a constructor argument"


@pytest.mark.parametrize("method", SCALING_METHODS)
def test_every_method_has_a_tag_and_a_label(method):
    opts = ENTRIES[method].model_validate({"method": method}).normalized()
    tag = ENTRIES[method].id_tag(opts)
    label = ENTRIES[method].row_label(opts, "fp16-emulated")
    assert tag and label and "\n" not in label
