"""``lsbench weights convert IN OUT``: the fc-reduced VGG16 as a backbone file of the VGG16 SSDs.

chainercv's SSD (and the SSD paper's Caffe model) starts from VGG16 with fc6/fc7 subsampled
into conv6 (3x3, dilation 6, 1024 channels) and conv7 (1x1, 1024): "VGG_ILSVRC_16_layers_fc_reduced".
torchvision's ImageNet VGG16 has no such convs, so without this file conv6/conv7 start from
scratch and the published recipe is not reproduced. Two public copies exist:

* chainercv's ``ssd_vgg16_imagenet_converted_2017_06_09.npz`` (Chainer npz written by
  ``examples/ssd/caffe2npz.py``): keys ``extractor/conv{1_1..5_3,6,7}/{W,b}`` (the names of
  ``chainercv.links.model.ssd.ssd_vgg16.VGG16``); conv1_1 already flipped BGR -> RGB by that script.
* ``vgg16_reducedfc.pth`` (amdegroot/ssd.pytorch, ``--basenet``): the state dict of the
  ``nn.ModuleList`` built by ``ssd.py:vgg(base['300'], 3)``: ``{i}.weight``/``{i}.bias`` for
  the 13 VGG convs at indices 0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28 (torchvision's own
  ``features`` indices), conv6 at 31 and conv7 at 33; Caffe's BGR input order, so conv1_1's
  input channels are flipped to RGB here.

Both expect 0-255 inputs minus the per-channel mean, which is how ``models/ssd.py`` normalises
(mean (123, 117, 104)/255, std 1/255 on [0, 1] images). The output is what ``models/ssd.py``
loads as ``model_options.backbone_weights``: torchvision's ``features.{i}.weight/bias`` plus
``conv6.*`` and ``conv7.*``. Anything else in the input (a classifier, multibox heads, the
L2Norm scale: ours starts at 20 as chainercv's) is left out and counted.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import torch

from .ssd import FC_REDUCED_KEYS, WeightsError

#: chainercv's names of the 13 VGG16 convs, in order
VGG_CONVS = (
    "conv1_1",
    "conv1_2",
    "conv2_1",
    "conv2_2",
    "conv3_1",
    "conv3_2",
    "conv3_3",
    "conv4_1",
    "conv4_2",
    "conv4_3",
    "conv5_1",
    "conv5_2",
    "conv5_3",
)
#: their index in torchvision's ``vgg16().features`` and in amdegroot's ``vgg()`` list
VGG_INDEX = (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28)
#: amdegroot's ``vgg()`` list: pool5 at 30, conv6 at 31, ReLU, conv7 at 33
PTH_FC_INDEX = {"conv6": 31, "conv7": 33}
_CHANNELS = (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512)
FORMATS = ("auto", "chainercv", "pytorch")


def expected_shapes() -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """chainercv name -> (weight shape, bias shape) of the fc-reduced VGG16."""
    out, cin = {}, 3
    for name, c in zip(VGG_CONVS, _CHANNELS):
        out[name] = ((c, cin, 3, 3), (c,))
        cin = c
    out["conv6"] = ((1024, 512, 3, 3), (1024,))
    out["conv7"] = ((1024, 1024, 1, 1), (1024,))
    return out


def _fail(path, problem: str):
    raise WeightsError(f"weights convert: {path}: {problem}")


def _detect(path: Path) -> str:
    if path.suffix == ".npz":
        return "chainercv"
    if path.suffix in (".pth", ".pt"):
        return "pytorch"
    # numpy's npz is a zip of .npy members; torch's zip format holds data.pkl
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except zipfile.BadZipFile:
        return "pytorch"  # torch's legacy (non-zip) format
    return "chainercv" if names and all(n.endswith(".npy") for n in names) else "pytorch"


def _read_chainercv(path: Path) -> tuple[dict, int]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        _fail(path, f"cannot read as a Chainer npz ({type(exc).__name__})")
    found: dict[str, dict[str, np.ndarray]] = {}
    used = set()
    for name in expected_shapes():
        for part in ("W", "b"):
            keys = [k for k in arrays if k == f"{name}/{part}" or k.endswith(f"/{name}/{part}")]
            if not keys:
                _fail(path, f"no {name}/{part} (expected chainercv's VGG16 keys, e.g. extractor/{name}/{part})")
            if len(keys) > 1:
                _fail(path, f"{name}/{part} is ambiguous: {keys[:3]}")
            found.setdefault(name, {})[part] = arrays[keys[0]]
            found[name][f"{part}_key"] = keys[0]
            used.add(keys[0])
    return found, len(arrays) - len(used)


def _read_pytorch(path: Path) -> tuple[dict, int]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        _fail(path, f"cannot read as a PyTorch state dict ({type(exc).__name__})")
    if not isinstance(state, dict):
        _fail(path, "does not hold a state dict")
    index = dict(zip(VGG_CONVS, VGG_INDEX)) | PTH_FC_INDEX
    found: dict[str, dict] = {}
    used = set()
    for name, i in index.items():
        for part, suffix in (("W", "weight"), ("b", "bias")):
            key = f"{i}.{suffix}"
            if key not in state:
                _fail(
                    path,
                    f"no key {key!r} ({name}; expected amdegroot/ssd.pytorch's vgg16_reducedfc layout "
                    f"'0.weight' ... '33.bias')",
                )
            v = state[key]
            if not isinstance(v, torch.Tensor):
                _fail(path, f"{key} is not a tensor")
            found.setdefault(name, {})[part] = v.detach().cpu().numpy()
            found[name][f"{part}_key"] = key
            used.add(key)
    # Caffe's VGG16 reads BGR images: conv1_1's input channels to RGB, as chainercv's caffe2npz does
    found["conv1_1"]["W"] = found["conv1_1"]["W"][:, ::-1]
    return found, len(state) - len(used)


def _check_output(src: Path, dst: Path) -> None:
    """Refuse an output path that cannot be written, before any work (a 0.5 GB read and convert)."""
    if dst.is_dir():
        _fail(dst, f"is a directory; give the file to write, e.g. {dst / 'vgg16_reducedfc_backbone.pth'}")
    if not dst.parent.is_dir():
        _fail(dst, "its directory does not exist")
    if dst.exists() and dst.resolve() == src.resolve():
        _fail(dst, "is the input file; choose another output path")


def _open_temp(dst: Path):
    """The temporary file the output is written to (renamed over ``dst`` when complete), opened now:
    a read-only or full location is one line before the input is read."""
    tmp = dst.with_name(dst.name + ".tmp")  # opened as a plain file: the umask's permissions, as dst's
    try:
        return open(tmp, "wb"), tmp
    except OSError as exc:
        _fail(dst, f"cannot write in {dst.parent} ({exc.strerror or type(exc).__name__})")


def _tensors(src: Path, found: dict) -> dict[str, torch.Tensor]:
    """The output state dict; wrong shapes, dtypes and non-finite values are refused naming the tensor."""
    out: dict[str, torch.Tensor] = {}
    for name, (wshape, bshape) in expected_shapes().items():
        w, b = np.asarray(found[name]["W"]), np.asarray(found[name]["b"])
        if w.shape != wshape or b.shape != bshape:
            _fail(
                src,
                f"{name} has shapes {tuple(w.shape)}/{tuple(b.shape)}, the fc-reduced VGG16's are {wshape}/{bshape}",
            )
        if not (np.issubdtype(w.dtype, np.floating) and np.issubdtype(b.dtype, np.floating)):
            _fail(src, f"{name} is not floating point ({w.dtype})")
        for part, arr in (("W", w), ("b", b)):
            bad = int(arr.size - np.isfinite(arr).sum())
            if bad:
                _fail(
                    src,
                    f"tensor {found[name][f'{part}_key']!r} ({name} {'weight' if part == 'W' else 'bias'}) "
                    f"holds {bad} non-finite value{'s' if bad > 1 else ''} (NaN or inf): a damaged file",
                )
        prefix = f"features.{VGG_INDEX[VGG_CONVS.index(name)]}" if name in VGG_CONVS else name
        out[f"{prefix}.weight"] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
        out[f"{prefix}.bias"] = torch.from_numpy(np.ascontiguousarray(b, dtype=np.float32))
    assert all(k in out for k in FC_REDUCED_KEYS)
    return out


def convert(src: str | Path, dst: str | Path, fmt: str = "auto") -> dict:
    """Write the backbone file ``dst`` from ``src``; return a summary (format, tensors, ignored keys).

    ``dst`` appears complete or not at all: the tensors go to a temporary file beside it, renamed
    over it at the end and removed on any failure.
    """
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if fmt not in FORMATS:
        raise WeightsError(f"weights convert: unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if not src.is_file():
        _fail(src, "not a file")
    _check_output(src, dst)
    f, tmp = _open_temp(dst)
    try:
        with f:
            kind = _detect(src) if fmt == "auto" else fmt
            found, ignored = (_read_chainercv if kind == "chainercv" else _read_pytorch)(src)
            tensors = _tensors(src, found)
            try:
                torch.save(tensors, f)
            except (OSError, RuntimeError) as exc:  # a full disk: torch says RuntimeError
                _fail(dst, f"cannot write ({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})")
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"format": kind, "tensors": len(tensors), "ignored_keys": ignored, "out": str(dst)}


def main(args) -> int:
    """``lsbench weights convert``; errors are ``WeightsError`` (one line, exit 2, in cli.py)."""
    res = convert(args.input, args.output, args.format)
    print(
        f"wrote {res['out']}: {res['tensors']} tensors (VGG16 conv1_1..conv5_3, conv6, conv7) from the "
        f"{res['format']} file" + (f"; {res['ignored_keys']} other key(s) left out" if res["ignored_keys"] else "")
    )
    print(f"use it as model_options: {{backbone_weights: {res['out']}}} with ssd300_vgg16 / ssd512_vgg16")
    return 0
