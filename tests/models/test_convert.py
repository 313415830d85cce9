"""``lsbench weights convert``: fc-reduced VGG16 files (synthetic, with the real layouts) -> a backbone file
that ssd300_vgg16/ssd512_vgg16 load, conv6/conv7 included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lossscale_bench.cli import main as cli_main
from lossscale_bench.models.convert import VGG_CONVS, VGG_INDEX, convert, expected_shapes
from lossscale_bench.models.ssd import WeightsError, ssd300_vgg16, ssd512_vgg16


def _random_layers(seed=0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        name: (rng.standard_normal(ws).astype(np.float32), rng.standard_normal(bs).astype(np.float32))
        for name, (ws, bs) in expected_shapes().items()
    }


def _chainercv_npz(path, layers, drop=None, reshape=None):
    """chainercv's layout (``ssd_vgg16_imagenet_converted_2017_06_09.npz``): extractor/<conv>/{W,b}, plus
    keys a converter must leave out (the L2Norm scale, a multibox head)."""
    arrays = {}
    for name, (w, b) in layers.items():
        arrays[f"extractor/{name}/W"] = w
        arrays[f"extractor/{name}/b"] = b
    arrays["extractor/norm4/scale"] = np.full(512, 20, np.float32)
    arrays["multibox/loc/0/W"] = np.zeros((16, 512, 3, 3), np.float32)
    if drop:
        del arrays[drop]
    if reshape:
        arrays[reshape] = arrays[reshape][:1]
    np.savez(path, **arrays)
    return path


def _reducedfc_pth(path, layers, drop=None):
    """amdegroot/ssd.pytorch's vgg16_reducedfc.pth: the vgg() ModuleList's state dict, convs at
    0, 2, 5, ..., 28, conv6 at 31, conv7 at 33."""
    index = dict(zip(VGG_CONVS, VGG_INDEX)) | {"conv6": 31, "conv7": 33}
    state = {}
    for name, (w, b) in layers.items():
        state[f"{index[name]}.weight"] = torch.from_numpy(w.copy())
        state[f"{index[name]}.bias"] = torch.from_numpy(b.copy())
    if drop:
        del state[drop]
    torch.save(state, path)
    return path


def _fc(model):
    """conv6 and conv7 of torchvision's VGG extractor (extra[0] ends in the pool5/conv6/conv7 block)."""
    fc = model.backbone.extra[0][-1]
    return fc[1], fc[3]


def test_chainercv_npz_converts_and_loads_into_both_ssds(tmp_path):
    layers = _random_layers(0)
    src = _chainercv_npz(tmp_path / "vgg.npz", layers)
    out = tmp_path / "backbone.pth"
    res = convert(src, out)
    assert res["format"] == "chainercv" and res["tensors"] == 30 and res["ignored_keys"] == 2
    for build in (ssd300_vgg16, ssd512_vgg16):
        model = build(num_classes=3, backbone_weights=str(out))
        conv6, conv7 = _fc(model)
        assert torch.equal(conv6.weight, torch.from_numpy(layers["conv6"][0]))
        assert torch.equal(conv6.bias, torch.from_numpy(layers["conv6"][1]))
        assert torch.equal(conv7.weight, torch.from_numpy(layers["conv7"][0]))
        assert torch.equal(conv7.bias, torch.from_numpy(layers["conv7"][1]))
        assert conv6.dilation == (6, 6) and conv7.kernel_size == (1, 1)
        # chainercv's npz is RGB already: conv1_1 unchanged; conv4_3 is features.21, conv5_3 extra.0.5
        assert torch.equal(model.backbone.features[0].weight, torch.from_numpy(layers["conv1_1"][0]))
        assert torch.equal(model.backbone.features[21].weight, torch.from_numpy(layers["conv4_3"][0]))
        assert torch.equal(model.backbone.extra[0][5].weight, torch.from_numpy(layers["conv5_3"][0]))


def test_reducedfc_pth_converts_with_conv1_1_to_rgb(tmp_path):
    layers = _random_layers(1)
    src = _reducedfc_pth(tmp_path / "vgg16_reducedfc.pth", layers)
    out = tmp_path / "backbone.pth"
    assert convert(src, out)["format"] == "pytorch"
    model = ssd300_vgg16(num_classes=3, backbone_weights=str(out))
    conv6, conv7 = _fc(model)
    assert torch.equal(conv6.weight, torch.from_numpy(layers["conv6"][0]))
    assert torch.equal(conv7.bias, torch.from_numpy(layers["conv7"][1]))
    # Caffe BGR -> RGB: input channel 0 of our conv1_1 is the file's channel 2
    w = torch.from_numpy(layers["conv1_1"][0])
    assert torch.equal(model.backbone.features[0].weight, w.flip(1))
    assert torch.equal(model.backbone.features[2].weight, torch.from_numpy(layers["conv1_2"][0]))


def test_without_conv6_conv7_the_model_keeps_its_init(tmp_path):
    """A plain torchvision-style features file still loads (conv6/conv7 Xavier-initialised), as before."""
    layers = _random_layers(2)
    full = tmp_path / "full.pth"
    convert(_chainercv_npz(tmp_path / "v.npz", layers), full)
    state = torch.load(full, weights_only=True)
    feats = tmp_path / "features.pth"
    torch.save({k: v for k, v in state.items() if k.startswith("features.")}, feats)
    model = ssd300_vgg16(num_classes=3, backbone_weights=str(feats))
    assert not torch.equal(_fc(model)[0].weight, torch.from_numpy(layers["conv6"][0]))
    half = tmp_path / "half.pth"
    torch.save({k: v for k, v in state.items() if not k.startswith("conv7.")}, half)
    with pytest.raises(WeightsError, match="conv6|missing"):
        ssd300_vgg16(num_classes=3, backbone_weights=str(half))


def test_cli_writes_the_file(tmp_path, capsys):
    src = _reducedfc_pth(tmp_path / "vgg16_reducedfc.pth", _random_layers(3))
    out = tmp_path / "b.pth"
    assert cli_main(["weights", "convert", str(src), str(out)]) == 0
    assert "30 tensors" in capsys.readouterr().out
    assert set(torch.load(out, weights_only=True)) >= {"conv6.weight", "conv7.bias", "features.28.weight"}


@pytest.mark.parametrize(
    "case", ["not_a_file", "garbage", "npz_missing_key", "npz_bad_shape", "pth_missing_key", "torchvision_vgg"]
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, case):
    layers = _random_layers(4)
    src = tmp_path / "in.npz"
    if case == "not_a_file":
        src = tmp_path / "nothing.npz"
    elif case == "garbage":
        src = tmp_path / "garbage.pth"
        src.write_bytes(b"not weights at all")
    elif case == "npz_missing_key":
        _chainercv_npz(src, layers, drop="extractor/conv6/W")
    elif case == "npz_bad_shape":
        _chainercv_npz(src, layers, reshape="extractor/conv7/W")
    elif case == "pth_missing_key":
        src = _reducedfc_pth(tmp_path / "in.pth", layers, drop="33.weight")
    elif case == "torchvision_vgg":  # the ImageNet VGG16 (features.*, classifier.*) is not the fc-reduced one
        src = tmp_path / "vgg16.pth"
        torch.save({"features.0.weight": torch.zeros(64, 3, 3, 3), "classifier.0.weight": torch.zeros(2, 2)}, src)
    out = tmp_path / "out.pth"
    assert cli_main(["weights", "convert", str(src), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lsbench: error: weights convert:") and "\n" not in err, err
    assert not out.exists()


# --------------------------------------------------------------------------- outputs, temp files, NaN


def _convert_cli(capsys, src, out) -> str:
    """``lsbench weights convert`` through the real CLI: exit 2 and one ``weights convert:`` line."""
    assert cli_main(["weights", "convert", str(src), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lsbench: error: weights convert:") and "\n" not in err and "Traceback" not in err, err
    return err


def _garbage(tmp_path):
    """An input that fails as soon as it is read: an output error naming the output proves the output
    was checked before any work."""
    src = tmp_path / "garbage.pth"
    src.write_bytes(b"not weights at all")
    return src


def test_an_existing_directory_as_output_is_refused_before_work(tmp_path, capsys):
    out = tmp_path / "weights"
    out.mkdir()
    err = _convert_cli(capsys, _garbage(tmp_path), out)
    assert f"{out}: is a directory; give the file to write, e.g. {out / 'vgg16_reducedfc_backbone.pth'}" in err
    assert list(out.iterdir()) == [] and not list(tmp_path.glob("*.tmp"))  # was an 80 MB .tmp left behind


def _read_only_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        (ro / "probe").touch()
    except PermissionError:
        return ro
    (ro / "probe").unlink()  # root ignores the mode bits; /sys refuses even root
    try:
        (Path("/sys") / "lsbench_probe").touch()
    except OSError:
        return Path("/sys")
    pytest.skip("no read-only location for this user")


def test_a_read_only_output_location_is_one_line_before_work(tmp_path, capsys):
    ro = _read_only_dir(tmp_path)
    err = _convert_cli(capsys, _garbage(tmp_path), ro / "backbone.pth")
    assert f"{ro / 'backbone.pth'}: cannot write in {ro} (" in err  # was a torch traceback


@pytest.mark.parametrize(
    "fmt, bad, key", [("npz", np.nan, "extractor/conv6/W"), ("pth", np.inf, "31.weight"), ("pth", -np.inf, "0.bias")]
)
def test_non_finite_weights_are_refused_naming_the_tensor_and_leave_no_temp_file(tmp_path, capsys, fmt, bad, key):
    layers = _random_layers(5)
    name, part = {"extractor/conv6/W": ("conv6", 0), "31.weight": ("conv6", 0), "0.bias": ("conv1_1", 1)}[key]
    layers[name][part].flat[7] = bad
    src = _chainercv_npz(tmp_path / "in.npz", layers) if fmt == "npz" else _reducedfc_pth(tmp_path / "in.pth", layers)
    out = tmp_path / "out" / "b.pth"
    out.parent.mkdir()
    err = _convert_cli(capsys, src, out)
    assert f"tensor {key!r}" in err and "1 non-finite value (NaN or inf)" in err, err
    assert list(out.parent.iterdir()) == []  # the temp file the work started is gone


def test_a_failed_conversion_keeps_the_previous_output(tmp_path, capsys):
    layers = _random_layers(6)
    out = tmp_path / "b.pth"
    convert(_reducedfc_pth(tmp_path / "good.pth", layers), out)
    before = out.read_bytes()
    layers["conv7"][1][0] = np.nan
    _convert_cli(capsys, _reducedfc_pth(tmp_path / "bad.pth", layers), out)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["b.pth", "bad.pth", "good.pth"]
