"""``lsbench plugins`` (every registered name, kind by kind, with where it comes from) and the check
``lsbench run`` makes of a study's models from outside the package before any trial run is opened."""

from __future__ import annotations

import sys

__all__ = ["cmd_plugins", "plugin_dataset_problems", "plugin_model_problems", "print_problems", "register"]


def register(sub) -> None:
    """Add ``lsbench plugins`` to the subcommands ``sub``."""
    sp = sub.add_parser(
        "plugins", help="list every model, scaling method, precision and data set a study may name, with its origin"
    )
    sp.set_defaults(func=cmd_plugins)


def cmd_plugins(args) -> int:
    """One line per plug-in: kind, name, origin (built in, or the entry point and its distribution) and
    the digest of its source where it comes from outside the package."""
    from .study.plugins import listing

    rows = listing()
    width = max(len(n) for _, n, _, _ in rows)
    kind = None
    for k, name, origin, digest in rows:
        if k != kind:
            print(f"{'' if kind is None else chr(10)}{k}s:")
            kind = k
        print(f"  {name:<{width}}  {origin}" + (f"  sha256:{digest}" if digest else ""))
    print(
        "\n(a model or a data set may also be named by import path, package.module:callable, found from "
        "the study file's folder, then sys.path)"
    )
    return 0


def _num_classes(study) -> int:
    classes = getattr(study.dataset, "classes", None)
    return len(classes) + 1 if classes else 3  # synthetic and generated COCO-shaped data: a few classes


def plugin_model_problems(study) -> list[str]:
    """One line per model from outside the package in ``study``'s grid that is not a detector:
    built and run once on two synthetic images (torchvision's interface), before any run is opened."""
    from .core.plugins import PluginError
    from .models import build_model, detector_problem
    from .study.models.signature import on_path

    grid = list(dict.fromkeys([*study.model, *(e.model for e in study.scaling if e.model is not None)]))
    opts = study.model_options.model_dump(mode="json", exclude_none=True)
    opts.pop("batched_loss", None)
    problems = []
    for name in grid:
        plugin = study.model_plugin(name)
        if plugin.built_in:
            continue
        where = f"model[{study.model.index(name)}]" if name in study.model else "model"
        size = int(opts.get("image_size") or getattr(study.dataset, "image_size", None) or 64)
        try:
            with on_path(study.plugin_dir()):
                model = build_model(name, num_classes=_num_classes(study), **opts)
            problem = detector_problem(model, min(size, 128))
        except PluginError as exc:
            problem = str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever the builder raises is the plug-in's error
            problem = f"building it raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if problem:
            problems.append(f"{study.source}: {where}: {name} is not a detector: {problem}")
    return problems


def plugin_dataset_problems(study) -> list[str]:
    """One line where ``study``'s data set is named by import path and its callable does not return a data
    set (:func:`lossscale_bench.data.dataset_problem`: built once, its first training sample read), before
    any run is opened."""
    from .core.plugins import PluginError
    from .data import build_datasets
    from .study.models.signature import on_path

    if study.dataset_plugin().built_in:
        return []
    size = study.model_options.model_dump(mode="json", exclude_none=True).get("image_size")
    try:
        with on_path(study.plugin_dir()):
            build_datasets(study.dataset.model_dump(mode="json"), image_size=size, max_val_images=1)
    except PluginError as exc:
        return [f"{study.source}: dataset.name: {exc}"]
    except Exception as exc:  # noqa: BLE001 - whatever the builder raises is the plug-in's error
        first = str(exc).splitlines()[0] if str(exc) else ""
        return [f"{study.source}: dataset.name: {study.dataset.name}: building it raised {type(exc).__name__}: {first}"]
    return []


def print_problems(problems: list[str]) -> bool:
    """Each of ``problems`` as one ``lsbench: error:`` line on stderr; whether there were any."""
    for p in problems:
        print(f"lsbench: error: {p}", file=sys.stderr)
    return bool(problems)
