"""NVIDIA DALI input (``loader: dali``): images decoded, mirrored and normalised by DALI.

:func:`make_batches` is a drop-in for :func:`~lossscale_bench.data.infinite_batches`:
it yields ``(step, images, targets)`` with the same batches in the same order
(epoch ``e`` is the permutation seeded ``seed + e``; ``start_step`` jumps
straight there), the same per-sample flips (decided by each sample's
augmentation seed) and the same targets, so a trial may switch loaders or
resume under the other one. Works for any data set of this package that keeps
per-image records: COCO 2017, the synthetic shapes (COCO format) and Pascal
VOC.

What runs where:

* DALI reads nothing by itself: the sample order, the flip decisions and the
  targets come from the data set's own records (an ``external_source``), the
  encoded image bytes are read from disk in the feeding thread. DALI decodes
  (``fn.decoders.image``: on the GPU with nvJPEG, ``device="mixed"``, when a
  CUDA device is used; on the CPU otherwise), mirrors and normalises
  (``fn.crop_mirror_normalize``: float32, CHW, 0..1) and prefetches batches in
  its own threads.
* The CPU-only pipeline (``device_id=None``, CPU operators only) is used when
  the trial's backend is not CUDA or no CUDA device is visible.
* Category ids: labels are the data set's contiguous ``1..K`` (COCO ids map
  through ``cat_to_label``; evaluation maps back with ``label_to_cat``). DALI's
  ``readers.coco`` is not used: it renumbers category ids unless
  ``avoid_class_remapping``, shuffles with its own generator and cannot resume
  at a step, which would break the loader-independent batch sequence above.
* A data set with an ``augment`` transform (VOC training with chainercv's SSD
  augmentation) gets it exactly as the PyTorch path applies it, after DALI
  decoded the image, on the host: the same ``(image, target, seed)`` gives the
  same sample under either loader. (A GPU-side SSD augmentation with
  ``fn.random_bbox_crop`` would be faster but a different random stream.)

Boxes are mirrored with the data set's own :func:`~.transforms.hflip` rule
(``x -> W - x``) on the decoded image width, so they equal the DataLoader's.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import epoch_order, sample_key, steps_per_epoch
from .transforms import flip_decision, shrink_to

INSTALL_HINT = "pip install 'lossscale_bench[dali]' (nvidia-dali-cuda120; installs without CUDA, CPU pipeline then)"


class DaliUnavailable(RuntimeError):
    """nvidia-dali is not installed, or the data set cannot be read by the DALI loader."""


def _import_dali():
    try:
        import nvidia.dali  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        raise DaliUnavailable(
            f"loader dali: cannot import nvidia.dali ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
        ) from None
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    return fn, types, pipeline_def


# --------------------------------------------------------------------------- records of any data set


def sample_info(ds, index: int) -> dict[str, Any]:
    """Path, boxes (xyxy pixels), labels and extra target keys of sample ``index``, without decoding it."""
    recs = getattr(ds, "_records", None)
    if recs is None:
        raise DaliUnavailable(f"loader dali: {type(ds).__name__} keeps no per-image records; use loader: torch for it")
    rec = recs[index]
    if hasattr(ds, "_image_path"):  # VOC
        path = Path(ds._image_path(rec))
        target = {"labels": rec["labels"].clone(), "difficult": rec["difficult"].clone(), "image_id": index}
    elif hasattr(ds, "image_dir"):  # COCO format (real COCO and the synthetic shapes)
        path = Path(ds.image_dir) / rec["file_name"]
        target = {"labels": rec["labels"].clone(), "image_id": rec["id"]}
    else:
        raise DaliUnavailable(f"loader dali: do not know where {type(ds).__name__} keeps its image files")
    return {
        "path": path,
        "boxes": rec["boxes"].clone(),
        "target": target,
        "size": (int(rec.get("width") or 0), int(rec.get("height") or 0)),
    }


def _flip_of(ds, aug_seed: int | None) -> bool:
    if aug_seed is None or not getattr(ds, "hflip", False):
        return False
    return flip_decision(aug_seed)


# --------------------------------------------------------------------------- the pipeline


def _use_gpu(device_id: int | None) -> bool:
    return device_id is not None


def build_pipeline(
    batch_size: int, source, *, device_id: int | None, num_threads: int = 1, prefetch: int = 2, seed: int = 0
):
    """A DALI pipeline: encoded bytes + mirror flags from ``source`` -> decoded float CHW images in 0..1."""
    fn, types, pipeline_def = _import_dali()
    gpu = _use_gpu(device_id)

    @pipeline_def(
        batch_size=batch_size,
        num_threads=max(1, int(num_threads)),
        device_id=device_id,
        prefetch_queue_depth=max(1, int(prefetch)),
        seed=int(seed) % 2**31,
    )
    def pipe():
        encoded, mirror = fn.external_source(
            source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT32], no_copy=False
        )
        images = fn.decoders.image(encoded, device="mixed" if gpu else "cpu", output_type=types.RGB)
        return fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[0.0, 0.0, 0.0],
            std=[255.0, 255.0, 255.0],
            mirror=mirror,
        )  # argument inputs live on the CPU

    p = pipe()
    p.build()
    return p


def _to_torch(tensor_list, gpu: bool) -> list[torch.Tensor]:
    if not gpu:
        return [torch.from_numpy(np.array(tensor_list[i])) for i in range(len(tensor_list))]
    from nvidia.dali.plugin.pytorch import feed_ndarray

    out = []
    for i in range(len(tensor_list)):
        t = tensor_list[i]
        dst = torch.empty(
            tuple(t.shape()), dtype=torch.float32, device=torch.device("cuda", torch.cuda.current_device())
        )
        feed_ndarray(t, dst, cuda_stream=torch.cuda.current_stream())
        out.append(dst)
    return out


class DaliBatches:
    """Iterator of ``(step, images, targets)``: :func:`infinite_batches`'s sequence, decoded by DALI."""

    def __init__(
        self,
        ds,
        batch_size: int,
        *,
        seed: int,
        start_step: int = 0,
        device_id: int | None = None,
        num_threads: int = 1,
        prefetch: int = 2,
    ) -> None:
        self.ds, self.batch_size, self.seed = ds, int(batch_size), int(seed)
        self.spe = steps_per_epoch(ds, self.batch_size)
        if self.spe == 0:
            raise ValueError(f"data set has {len(ds)} samples, fewer than one batch of {batch_size}")
        self.step = int(start_step)
        self.gpu = _use_gpu(device_id)
        self._keys = self._key_stream(self.step)
        self._meta: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self.pipe = build_pipeline(
            self.batch_size, self._feed, device_id=device_id, num_threads=num_threads, prefetch=prefetch, seed=seed
        )

    def _key_stream(self, start_step: int) -> Iterator[list]:
        """The keys of every batch from ``start_step`` on, as ``infinite_batches`` orders them."""
        epoch, offset = divmod(int(start_step), self.spe)
        while True:
            order = epoch_order(len(self.ds), self.seed, epoch, True)
            for b in range(offset, self.spe):
                yield [
                    sample_key(self.ds, self.seed, epoch, i)
                    for i in order[b * self.batch_size : (b + 1) * self.batch_size]
                ]
            epoch, offset = epoch + 1, 0

    def _feed(self):
        """external_source callback: one batch of encoded images and mirror flags; targets queued aside."""
        with self._lock:
            keys = next(self._keys)
        encoded, mirror, meta = [], [], []
        for key in keys:
            index, aug_seed = key if isinstance(key, tuple) else (key, None)
            info = sample_info(self.ds, index)
            flip = _flip_of(self.ds, aug_seed)
            encoded.append(np.fromfile(info["path"], dtype=np.uint8))
            mirror.append(np.array(int(flip), dtype=np.int32))
            meta.append((info, flip, aug_seed))
        with self._lock:
            self._meta.append(meta)
        return encoded, mirror

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, list[torch.Tensor], list[dict]]:
        (out,) = self.pipe.run()
        if self.gpu:
            images = _to_torch(out, gpu=True)
        else:
            images = _to_torch(out.as_cpu() if hasattr(out, "as_cpu") else out, gpu=False)
        with self._lock:
            meta = self._meta.popleft()
        targets = []
        augment = getattr(self.ds, "augment", None)
        max_side = getattr(self.ds, "max_side", None)  # dataset.train_max_side: shrunk as load() shrinks
        for k, (info, flip, aug_seed) in enumerate(meta):
            target = dict(info["target"])
            boxes = info["boxes"]
            if max_side:
                h, w = images[k].shape[-2:]
                small = shrink_to(images[k], max_side)
                if small is not images[k]:  # the boxes scaled as VOCDetection.load scales them
                    sx, sy = small.shape[-1] / w, small.shape[-2] / h
                    boxes = boxes * torch.tensor([sx, sy, sx, sy], dtype=boxes.dtype, device=boxes.device)
                    images[k] = small
            width = images[k].shape[-1]
            if flip:
                unflipped, boxes = boxes, boxes.clone()
                boxes[:, 0], boxes[:, 2] = width - unflipped[:, 2], width - unflipped[:, 0]
            target["boxes"] = boxes
            if augment is not None:  # the data set's own SSD augmentation, as on the PyTorch path
                img, target = augment(
                    images[k].cpu(), target, aug_seed if aug_seed is not None else int(torch.randint(0, 2**62, ()))
                )
                images[k] = img
            targets.append(target)
        step = self.step
        self.step += 1
        return step, images, targets


def dali_device_id(cfg) -> int | None:
    """0 (the trial's own GPU: Ray and the CUDA backend make it ``cuda:0``) for CUDA trials with a GPU, else None."""
    backend = (cfg.resources or {}).get("backend", "cpu")
    if backend in ("cuda", "auto") and torch.cuda.is_available():
        return 0
    return None


def make_batches(cfg, train_ds, start_step: int = 0) -> Iterator[tuple[int, list, list]]:
    """``(step, images, targets)`` for the trial ``cfg`` from DALI (same contract as ``infinite_batches``).

    ``loader: torch`` configs get :func:`infinite_batches` itself, so a caller may use this for both.
    """
    if getattr(cfg, "loader", "torch") != "dali":
        from . import infinite_batches

        return infinite_batches(train_ds, cfg.batch_size, seed=cfg.stream_seed("data"), start_step=start_step)
    from ..core.env_vars import env_number

    threads = max(1, int(float((cfg.resources or {}).get("cpus_per_trial", 1))))
    return DaliBatches(
        train_ds,
        cfg.batch_size,
        seed=cfg.stream_seed("data"),
        start_step=start_step,
        device_id=dali_device_id(cfg),
        num_threads=int(env_number("LSBENCH_DALI_THREADS", threads)),
    )
