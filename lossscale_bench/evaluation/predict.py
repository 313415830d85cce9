"""The inference loop both evaluators share: model in eval mode, batches of un-augmented images,
the caller's autocast around each forward, the model's previous mode restored afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def load_plain(dataset, index: int):
    """An evaluation sample: never flipped or augmented."""
    if hasattr(dataset, "load"):
        return dataset.load(index, flip=False)
    return dataset[index]


@torch.no_grad()
def predictions(
    model, dataset, *, device="cpu", batch_size: int = 8, max_images=None, autocast=None
) -> Iterator[tuple[dict, dict]]:
    """Yield ``(target, output)`` for the first ``max_images`` images of ``dataset``."""
    n = len(dataset) if max_images is None else min(len(dataset), int(max_images))
    was_training = model.training
    model.eval()
    try:
        for start in range(0, n, batch_size):
            batch = [load_plain(dataset, i) for i in range(start, min(n, start + batch_size))]
            images = [img.to(device) for img, _ in batch]
            with autocast() if autocast is not None else contextlib.nullcontext():
                outputs = model(images)
            for (_, target), out in zip(batch, outputs):
                yield target, out
    finally:
        model.train(was_training)
