"""Where the synthetic set is cached, and whether it can be: the one definition the generator and the checks share.

``data.synthetic`` generates each parameter set once into
``<cache>/<dataset_dirname(...)>``, the cache being ``dataset.root`` when the
study gives one, else ``$LSBENCH_DATA``, else ``~/.cache/lossscale_bench``.

Why here, in the schema layer: ``lsbench validate`` and ``run`` check the
cache before any work (:func:`cache_problem`), without torch or numpy; a
cache that is a file or read-only used to pass ``validate`` and then end
``run`` in a traceback. Two copies of the location rule could drift, and then
the check would look at another folder than the generator writes.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.writable import folder_problem

__all__ = ["GENERATOR_VERSION", "default_root", "dataset_dirname", "cache_root", "cache_problem"]

#: bump when ``data.synthetic``'s output changes, so stale caches are not reused
GENERATOR_VERSION = 4


def default_root() -> Path:
    """``$LSBENCH_DATA`` if set, else ``~/.cache/lossscale_bench``."""
    env = os.environ.get("LSBENCH_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lossscale_bench"


def dataset_dirname(*, train_images: int, val_images: int, image_size: int, seed: int) -> str:
    return f"synthetic-v{GENERATOR_VERSION}-{image_size}px-{train_images}-{val_images}-s{seed}"


def cache_root(root: str | Path | None) -> Path:
    """The cache a synthetic set with ``dataset.root`` ``root`` (None: not given) lives in."""
    return Path(root).expanduser() if root is not None else default_root()


def cache_problem(ds) -> str | None:
    """What stops the synthetic set ``ds`` (a ``SyntheticDataset``) being used, as one line naming the
    cache, or None.

    A set already generated is only read, so a read-only cache that holds it is fine
    (a shared, pre-filled cache); otherwise the cache must be a folder that can be written.
    """
    base = cache_root(ds.root)
    name = dataset_dirname(
        train_images=ds.train_images, val_images=ds.val_images, image_size=ds.image_size, seed=ds.seed
    )
    try:
        if (base / name / "annotations" / "val.json").is_file():  # the generator's "complete" marker
            return None
    except OSError:  # a cache that cannot be searched: folder_problem says what it can
        pass
    problem = folder_problem(base)
    if problem is None:
        return None
    if ds.root is not None:
        where, fix = f"the synthetic data cache {base}", "choose a dataset.root"
    elif os.environ.get("LSBENCH_DATA"):
        where, fix = f"the synthetic data cache $LSBENCH_DATA={base}", "set LSBENCH_DATA to a folder"
    else:
        where, fix = f"the default synthetic data cache {base}", "set LSBENCH_DATA to a folder"
    return f"{where} {problem}; the set is generated there on first use: {fix} that can be written"
