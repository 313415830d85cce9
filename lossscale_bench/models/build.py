"""Build any detector a study names, and check that a model from outside the package is one.

:func:`build_model` builds a registered name (the package's or an entry point's, from its registry
entry's import path) or an import path ``package.module:callable`` a study names, as
``builder(num_classes=N, **options)``. :func:`detector_problem` runs a model from outside the package
once on a tiny synthetic batch before any trial starts: torchvision's detection interface, in
training a dict of loss tensors, in eval a list of ``{"boxes", "labels", "scores"}`` per image.
"""

from __future__ import annotations

from importlib import import_module

import torch
from torch import nn

from ..core.plugins import PluginError

__all__ = ["DETECTION_KEYS", "build_model", "builder_of", "detector_problem"]

#: what an eval-mode detector returns for each image
DETECTION_KEYS = ("boxes", "labels", "scores")


def builder_of(name: str):
    """The callable behind a model name or import path (imported now).

    Without pydantic (the bare GPU machine that runs benchmarks/gpu_check.py, where the study layer's
    registry cannot load) a built-in name is the function of that name in this package's model modules,
    and an import path is taken as written."""
    try:
        from ..study import plugins
    except ImportError as exc:
        if "pydantic" not in str(exc):
            raise
        return _builder_without_pydantic(name)
    plugin = plugins.entry("model", name)
    module, attr = plugin.target.split(":")
    try:
        mod = import_module(module)
    except ImportError as exc:
        raise PluginError(f"model {name!r}: cannot import {module}: {exc}") from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise PluginError(f"model {name!r}: module {module} has no attribute {attr!r}") from None


def _builder_without_pydantic(name: str):
    if ":" in name:
        module, attr = name.split(":")
        return getattr(import_module(module), attr)
    for module in ("ssd", "torchvision_detectors"):
        fn = getattr(import_module(f"{__package__}.{module}"), name, None)
        if callable(fn):
            return fn
    raise ValueError(f"unknown model {name!r}")


def build_model(name: str, num_classes: int, batched_loss: bool | None = None, **options) -> nn.Module:
    """Build a detector by registry name or import path; ``options`` are the study's ``model_options``.

    ``batched_loss`` (the package's SSDs): true matches anchors and computes the multibox loss over the
    whole batch (:class:`.multibox_loss.BatchedLossSSD`), equal to torchvision's per-image loop within
    float tolerance, not bitwise; false or None (not given: what a trial config without the key means,
    see ``study.grid.default_batched_loss``) keeps torchvision's ``SSD.forward``. The subclass holds
    no state, so it is applied by class assignment after any builder: state dicts are unchanged.
    """
    model = builder_of(name)(num_classes=num_classes, **options)
    from torchvision.models.detection.ssd import SSD

    if batched_loss and type(model) is SSD:  # the multibox loss; RetinaNet/FCOS keep their own
        from .multibox_loss import BatchedLossSSD

        model.__class__ = BatchedLossSSD
    return model


def _batch(image_size: int, n: int = 2):
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, image_size, image_size, generator=g) for _ in range(n)]
    s = float(image_size)
    targets = [
        {"boxes": torch.tensor([[0.1 * s, 0.2 * s, 0.6 * s, 0.7 * s]]), "labels": torch.tensor([1])} for _ in range(n)
    ]
    return images, targets


def _what(value) -> str:
    if isinstance(value, dict):
        return "a dict with " + (", ".join(f"{k}: {type(v).__name__}" for k, v in list(value.items())[:4]) or "nothing")
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}" + (f" {type(value[0]).__name__}" if value else "")
    return f"a {type(value).__name__}"


def detector_problem(model: nn.Module, image_size: int) -> str | None:
    """What is wrong with ``model`` as a detector (one line), or None: trained and evaluated once
    on two synthetic images of ``image_size`` pixels with one box each."""
    if not isinstance(model, nn.Module):
        return f"the builder returned {_what(model)}, not a torch.nn.Module"
    images, targets = _batch(image_size)
    model.train()
    try:
        losses = model(images, targets)
    except Exception as exc:  # noqa: BLE001 - whatever it raises says it is not a detector
        return f"in training, model(images, targets) raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not isinstance(losses, dict) or not losses or not all(isinstance(v, torch.Tensor) for v in losses.values()):
        return f"in training, model(images, targets) returned {_what(losses)} (expected a dict of loss tensors)"
    model.eval()
    try:
        with torch.no_grad():
            out = model(images)
    except Exception as exc:  # noqa: BLE001
        return f"in eval, model(images) raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not isinstance(out, (list, tuple)) or len(out) != len(images):
        return f"in eval, model(images) returned {_what(out)} (expected a list of one dict per image)"
    for d in out:
        missing = [k for k in DETECTION_KEYS if not isinstance(d, dict) or not isinstance(d.get(k), torch.Tensor)]
        if missing:
            return (
                f"in eval, model(images) returned {_what(d)} per image (expected tensors {', '.join(DETECTION_KEYS)})"
            )
    model.train()
    return None
