"""The FP4 precisions: the table's entries and options, what the emulation does with them (the
split backward of the Hadamard transform and of NVFP4 weights), their telemetry, and every scaling
method running a few steps in them on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import one_entry_study, study_yaml
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.numerics.fp4 import fp4_round
from lossscale_bench.numerics.hadamard import H16, hadamard_round
from lossscale_bench.precision import get_precision
from lossscale_bench.precision.formats import E4M3, Fp4Format
from lossscale_bench.precision.telemetry import UnderflowProbe
from lossscale_bench.study import StudyError, load_study_text
from lossscale_bench.study.precisions import PRECISION_OPTIONS, PRECISION_SPECS
from lossscale_bench.trial import run_trial

FP4 = [n for n, s in PRECISION_SPECS.items() if s.grad_format == "e2m1"]


def test_six_fp4_precisions_say_what_they_are():
    assert [f"{f}fwd-{g}grad-emulated" for f in ("e4m3", "nvfp4") for g in ("e2m1", "nvfp4", "mxfp4")] == FP4
    for name in FP4:
        p = get_precision(name)
        spec = PRECISION_SPECS[name]
        fwd, grads = name.split("fwd-")[0], name.split("fwd-")[1].split("grad")[0]
        assert isinstance(p.grad_format, Fp4Format) and p.grad_format.kind == grads and p.grad_format.stochastic
        assert p.emulated and p.needs_scaler and not p.wgrad_hadamard
        if fwd == "e4m3":
            assert p.forward_format is E4M3 and p.weight_format is None
        else:
            assert p.forward_format.kind == "nvfp4" and not p.forward_format.stochastic and p.weight_format.weight
        assert "not real fp4" in spec.note and ("OCP MX" in spec.note) == (grads == "mxfp4")
        assert ("NVFP4BlockScaling" in spec.note) == (grads == "nvfp4")
    assert PRECISION_SPECS["nvfp4fwd-nvfp4grad-emulated"].te_format == "NVFP4BlockScaling"


def test_precision_options_change_the_formats():
    p = get_precision("e4m3fwd-mxfp4grad-emulated", fp4_rounding="nearest", wgrad_hadamard=True, mx_exponent="ceil")
    assert (p.grad_format.kind, p.grad_format.stochastic, p.grad_format.mode, p.wgrad_hadamard) == (
        "mxfp4",
        False,
        "ceil",
        True,
    )
    assert p.grad_format.name == "mxfp4-ceil"
    with pytest.raises(ValueError, match="not an option"):
        get_precision("e4m3fwd-nvfp4grad-emulated", mx_exponent="ceil")
    with pytest.raises(ValueError, match="not an option"):
        get_precision("fp8-e4m3-emulated", fp4_rounding="nearest")
    with pytest.raises(ValueError, match="fp8"):
        get_precision("e4m3fwd-e2m1grad-emulated", grad_blocks="mx32")


@pytest.mark.parametrize(
    "precision,entry,path",
    [
        ("e4m3fwd-nvfp4grad-emulated", "{method: none, mx_exponent: ceil}", "scaling[0].mx_exponent"),
        ("fp8-e4m3-emulated", "{method: none, fp4_rounding: nearest}", "scaling[0].fp4_rounding"),
        ("fp32", "{method: none, wgrad_hadamard: true}", "scaling[0].wgrad_hadamard"),
        ("e4m3fwd-e2m1grad-emulated", "{method: none, grad_blocks: mx32}", "scaling[0].grad_blocks"),
        ("e4m3fwd-e2m1grad-emulated", "{method: none, fp4_rounding: up}", "scaling[0].fp4_rounding"),
    ],
)
def test_precision_options_only_where_they_mean_something(precision, entry, path):
    with pytest.raises(StudyError) as err:
        load_study_text(one_entry_study(entry, precision), source="x.yaml")
    assert str(err.value).startswith(f"x.yaml: {path}: ")


def test_precision_options_enter_the_trial_id_only_off_their_default():
    def trial(entry, precision="e4m3fwd-mxfp4grad-emulated"):
        return load_study_text(one_entry_study(entry, precision)).trials()[0]

    plain = trial("{method: fixed, scale: 128}")
    assert (
        plain.trial_id
        == trial(
            "{method: fixed, scale: 128, fp4_rounding: stochastic, wgrad_hadamard: false, mx_exponent: floor}"
        ).trial_id
    )
    other = trial("{method: fixed, scale: 128, fp4_rounding: nearest, wgrad_hadamard: true, mx_exponent: ceil}")
    assert other.trial_id != plain.trial_id
    assert other.label == "loss scale (128) (nearest-rounded grads, Hadamard wgrad, MX exponent rounded up)"
    assert {k: other.scaling[k] for k in PRECISION_OPTIONS} == {
        "fp4_rounding": "nearest",
        "wgrad_hadamard": True,
        "mx_exponent": "ceil",
    }


def test_block_format_telemetry_counts_in_the_scaled_domain():
    """A value 2^-10 flushes in plain E2M1 but survives in an NVFP4 block of its own size; next to
    a large value in its block it flushes; the census says so (no per-element subnormal count). At
    2^-20 of the tensor's max a block's E4M3 scale underflows: the block flushes, and does not
    count as saturated although its encode scale (FLT_MAX) puts it far past 6."""
    nv = get_precision("e4m3fwd-nvfp4grad-emulated").grad_format
    g = torch.full((32,), 2.0**-10)
    g[16] = 1.0  # the second block's max: its 15 small neighbours flush
    assert nv.census(g).tolist() == [32, -1, 15, 0]
    assert nv.census(torch.where(g == 1.0, 1.0, 2.0**-20)).tolist() == [32, -1, 31, 0]
    plain = get_precision("e4m3fwd-e2m1grad-emulated").grad_format
    assert plain.census(g).tolist() == [32, 31, 31, 0] and plain.thresholds["flush_at_or_below"] == 0.25
    calls = nv.stream.calls
    nv.census(g)
    assert nv.stream.calls == calls  # the census draws no random numbers


def _hadamard_by_channel(g2: torch.Tensor, round_fn) -> torch.Tensor:
    """The transform written out per channel (``g2``: ``[channels, tokens]``): every group of 16 tokens
    ``t = H v``, rounded as one ``[channels, padded tokens]`` matrix, then ``H^T t``."""
    c, k = g2.shape
    pad = -k % 16
    x = torch.cat([g2, torch.zeros(c, pad)], 1)
    t = torch.stack([torch.cat([H16 @ x[i, j : j + 16] for j in range(0, k + pad, 16)]) for i in range(c)])
    q = round_fn(t)
    back = torch.stack([torch.cat([H16.T @ q[i, j : j + 16] for j in range(0, k + pad, 16)]) for i in range(c)])
    return back[:, :k]


@pytest.mark.parametrize("tokens,channels", [(64, 16), (72, 12), (40, 6), (16, 1)])
def test_hadamard_round_is_the_per_channel_transform(tokens, channels):
    # Integer inputs keep every sum of the transform exact (entries +-1/4), whatever order a matrix product
    # adds in, so the comparison can be bit for bit; the rounding sees the [channels, tokens] matrix (its
    # logical order: NVFP4 blocks of 16 along the tokens, the stochastic draws of that matrix).
    assert torch.equal(H16 @ H16.T, torch.eye(16))
    g2 = torch.randint(-64, 65, (channels, tokens)).float()
    seen = []

    def identity(t):
        seen.append(t.reshape(channels, -1).clone() if t.dim() == 2 else t[0, :, 0, :].clone())
        return t

    assert torch.equal(hadamard_round(g2.T.contiguous(), identity), g2.T)
    _hadamard_by_channel(g2, identity)
    assert torch.equal(seen[0], seen[1])
    key = torch.tensor(11)
    want = _hadamard_by_channel(g2, lambda t: fp4_round(t, "nvfp4", stochastic=True, key=key))
    got = hadamard_round(g2.T.contiguous(), lambda t: fp4_round(t, "nvfp4", stochastic=True, key=key))
    # the inverse adds rounded values of any size: its sums may round, to within the largest value's ulps
    assert torch.allclose(got.T, want, rtol=0, atol=1e-6 * want.abs().max().item())
    assert not torch.equal(got.T, g2)


@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_hadamard_moves_only_the_weight_gradient(layer):
    def grads(hadamard):
        torch.manual_seed(0)
        if layer == "linear":
            mod, x = nn.Linear(16, 8), torch.randn(64, 16, requires_grad=True)
        else:
            mod = nn.Conv2d(4, 8, 3, padding=1).to(memory_format=torch.channels_last)
            x = torch.randn(2, 4, 6, 6).contiguous(memory_format=torch.channels_last).requires_grad_()
        p = get_precision("e4m3fwd-nvfp4grad-emulated", fp4_rounding="nearest", wgrad_hadamard=hadamard)
        p.prepare(mod)
        weights = torch.linspace(-3, 3, 8).reshape(8, *([1, 1] if layer == "conv" else []))
        (mod(x) * weights).pow(3).sum().backward()
        return x.grad, mod.weight.grad, mod.bias.grad

    (dx0, dw0, db0), (dx1, dw1, db1) = grads(False), grads(True)
    assert torch.equal(dx0, dx1) and not torch.equal(dw0, dw1)
    # a conv's bias gradient is a sum of the same rounded gradient, in another order than oneDNN's
    assert torch.equal(db0, db1) if layer == "linear" else torch.allclose(db0, db1, rtol=1e-5, atol=0)


def test_nvfp4_forward_rounds_the_weights_in_16x16_tiles():
    torch.manual_seed(1)
    conv = nn.Conv2d(4, 20, 3, padding=1)
    p = get_precision("nvfp4fwd-nvfp4grad-emulated")
    p.prepare(conv)
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    y = conv(x)
    want = fp4_round(
        F.conv2d(x.detach(), fp4_round(conv.weight.detach(), "nvfp4", weight=True), conv.bias, 1, 1), "nvfp4"
    )
    assert torch.equal(y, want)
    y.relu_().sum().backward()  # an in-place op on the output is allowed
    assert x.grad is not None and conv.weight.grad is not None and torch.isfinite(conv.weight.grad).all()


def _split_net():
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 8 * 8, 4),
    ).to(memory_format=torch.channels_last)


def _input_grad(precision, entry, scale_fn=None, **opts):
    """The model input's gradient (as the loss scales carry it) and the scaler, after one backward."""
    from lossscale_bench.scaling import build_scaler
    from lossscale_bench.scaling.adaptive import AdaptiveLossScaler

    net = _split_net()
    p = get_precision(precision, **opts)
    scaler = (
        AdaptiveLossScaler(net, scale_fn=scale_fn)
        if scale_fn
        else build_scaler(entry, model=net, grad_format=p.grad_format)
    )
    p.prepare(net)
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last).requires_grad_()
    scaler.scale(net(x).pow(2).mean() * 1e3).backward()
    return x.grad, scaler


@pytest.mark.parametrize(
    "entry",
    [
        {"method": "adaptive"},
        {"method": "layerwise_dynamic", "init_scale": 4.0},
        {"method": "amax", "recipe": "current", "margin": 1},
    ],
)
def test_per_layer_scalers_scale_the_split_layers(entry):
    # The Hadamard transform's layers compute their backward in fp4_layers: a per-layer scaler must still
    # find them (it found none, and scaled nothing) and fold its factor into the input-gradient product,
    # which the transform does not touch: the input gradient and every layer's scale are those of the
    # same precision without the transform (nearest rounding: the transform's extra draws cannot differ).
    plain, s0 = _input_grad("e4m3fwd-nvfp4grad-emulated", entry, fp4_rounding="nearest")
    split, s1 = _input_grad("e4m3fwd-nvfp4grad-emulated", entry, fp4_rounding="nearest", wgrad_hadamard=True)
    assert s1._last_plan["layers"] == s0._last_plan["layers"] == 3
    assert torch.equal(plain, split)
    assert [r["scale"] for r in s0.layer_table()] == [r["scale"] for r in s1.layer_table()]


@pytest.mark.parametrize("opts", [{"wgrad_hadamard": True}, {}])
def test_per_layer_factors_reach_the_input_gradient_through_nvfp4_weights(opts):
    # NVFP4 forward values and weights (the recipe's precision) split every layer: a factor of 4 per layer
    # must multiply the input gradient by 4 per layer above it, exactly (NVFP4 rounding has a per-tensor
    # scale: a power of two passes through it unchanged)
    one, _ = _input_grad("nvfp4fwd-nvfp4grad-emulated", None, scale_fn=lambda *a: 1.0, fp4_rounding="nearest", **opts)
    four, s = _input_grad("nvfp4fwd-nvfp4grad-emulated", None, scale_fn=lambda *a: 4.0, fp4_rounding="nearest", **opts)
    assert s._last_plan["layers"] == 3 and one.abs().max() > 0
    assert torch.equal(four, one * 4.0**3)


def test_nvfp4_weights_computed_once_and_the_parameter_always_put_back(monkeypatch):
    conv = nn.Conv2d(4, 20, 3, padding=1)
    param = conv.weight
    get_precision("nvfp4fwd-nvfp4grad-emulated").prepare(conv)
    calls = []
    real = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda x, w, *a: calls.append(w) or real(x, w, *a))
    conv(torch.randn(2, 4, 6, 6, requires_grad=True)).sum().backward()
    assert len(calls) == 1 and torch.equal(calls[0], fp4_round(param.detach(), "nvfp4", weight=True))
    assert conv.weight is param and conv.weight.grad is not None and list(conv.parameters())[0] is param
    with pytest.raises(RuntimeError):
        conv(torch.randn(2, 3, 6, 6))  # wrong channel count: the forward raises with the rounded weight in place
    assert conv.weight is param and isinstance(conv.weight, nn.Parameter)


def test_probe_sees_fp4_gradients_before_rounding():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 1))
    p = get_precision("e4m3fwd-e2m1grad-emulated", fp4_rounding="nearest", wgrad_hadamard=True)
    probe = UnderflowProbe(model, fmt=p.telemetry_format, emulation=p.prepare(model))
    probe.arm()
    model(torch.randn(8, 16)).sum().mul(1e-3).backward()
    rates = probe.read()
    # the last layer's gradient (1e-3 each) is below half E2M1's subnormal: counted as flushed, then flushed,
    # so nothing reaches the first layer
    assert rates["1"]["nonzero"] == 8 and rates["1"]["flush_rate"] == 1.0 and rates["0"]["nonzero"] == 0


def _fp4_study(entry: str, precision: str, iterations: int = 3, seed: int = 0, **extra) -> str:
    return study_yaml(
        precision=precision,
        scaling=[entry],
        seeds=[seed],
        schedule={"iterations": iterations, "lr": 0.01, "warmup_iterations": 1},
        **extra,
    )


METHODS = [
    "{method: none}",
    "{method: fixed, scale: 128}",
    "{method: dynamic, style: chainer}",
    "{method: dynamic, style: torch}",
    "{method: dynamic, style: deepspeed}",
    "{method: layerwise_dynamic}",
    "{method: amax, recipe: current, margin: 1}",
    "{method: adaptive}",
    "{method: saturation, init_scale: 65536, interval: 2}",
]


#: precision and the options of its rows; method i runs in VARIANTS[i % 3] (every method, every variant,
#: 9 trials rather than 27: a trial costs seconds here)
VARIANTS = [
    ("e4m3fwd-e2m1grad-emulated", ""),
    ("e4m3fwd-nvfp4grad-emulated", ", wgrad_hadamard: true"),
    ("nvfp4fwd-mxfp4grad-emulated", ", fp4_rounding: nearest, mx_exponent: ceil"),
]


@pytest.mark.parametrize("entry,precision,extra", [(m, *VARIANTS[i % 3]) for i, m in enumerate(METHODS)])
def test_every_method_trains_in_fp4(tmp_path, monkeypatch, precision, extra, entry):
    monkeypatch.setenv("LSBENCH_NO_COMPILE", "1")  # the compiled kernels have their own tests
    cfg = load_study_text(_fp4_study(entry[:-1] + extra + "}", precision)).trials()[0]
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=tmp_path)
    assert out.status == "finished", out.error
    assert len(sink.history("loss")) == 3 and all(math.isfinite(v) for _, v in sink.history("loss"))
    assert sink.history("flush_rate_mean")


def test_stochastic_rounding_is_seeded_by_the_trial(tmp_path, monkeypatch):
    monkeypatch.setenv("LSBENCH_NO_COMPILE", "1")

    def losses(seed, where, precision="e4m3fwd-e2m1grad-emulated"):
        """Initial weights and batch order on seed 0 whatever the trial's seed: only the rounding's draws
        follow the trial seed."""
        sink = MemorySink()
        cfg = load_study_text(
            _fp4_study("{method: fixed, scale: 1024}", precision, 4, seed, seed_streams={"init": 0, "data": 0})
        ).trials()[0]
        assert run_trial(cfg, sink=sink, trial_dir=tmp_path / where).status == "finished"
        return [v for _, v in sink.history("loss")]

    a, b, c = losses(0, "a"), losses(0, "b"), losses(1, "c")
    assert a == b and a != c and a[0] == c[0]  # the first loss comes before any gradient is rounded
    near0, near1 = (losses(s, f"n{s}", "fp8-e4m3-emulated") for s in (0, 1))
    assert near0 == near1  # the control: without stochastic rounding the trial seed changes nothing here


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("stochastic", [True, False])
def test_parameter_gradients_rounded_at_the_end_of_backward_as_one_call_each_would(kind, stochastic):
    # The parameter gradients of a per-tensor FP4 format are rounded together when the backward ends
    # (Fp4Format.round_each_), with the keys drawn where a rounding per parameter drew them, between the
    # activation gradients' roundings. The reference rounds each parameter at its own hook, from a stream
    # with the same seed: every gradient must come out the same, bit for bit.
    from lossscale_bench.precision import install_emulation
    from lossscale_bench.precision.formats import fp4_format

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 8, 1),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 5),
    )
    ref = type(model)(*[m for m in __import__("copy").deepcopy(model)])
    x = torch.randn(4, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    model, ref = model.to(memory_format=torch.channels_last), ref.to(memory_format=torch.channels_last)

    new_fmt = fp4_format(kind, stochastic=stochastic, seed=7)
    install_emulation(model, E4M3, new_fmt)
    model(x).square().sum().backward()

    ref_fmt = fp4_format(kind, stochastic=stochastic, seed=7)
    install_emulation(ref, E4M3, ref_fmt, round_param_grads=False)

    def round_now(p):
        p.grad.copy_(ref_fmt.round(p.grad))

    for p in ref.parameters():
        p.register_post_accumulate_grad_hook(round_now)
    ref(x).square().sum().backward()

    assert not stochastic or new_fmt.stream.calls == ref_fmt.stream.calls > 8
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p.grad.view(torch.int32), q.grad.view(torch.int32)), name
        assert p.grad.abs().max() > 0, name


def test_round_each_is_round_per_tensor_with_its_key():
    from lossscale_bench.precision.formats import fp4_format

    g = torch.Generator().manual_seed(3)
    shapes = [(16, 8, 3, 3), (40,), (7, 5), (4, 16, 4, 4), (3, 5, 2, 3)]
    for kind in ("nvfp4", "mxfp4"):
        ts = [torch.randn(s, generator=g) * 10.0 ** torch.randint(-3, 3, (), generator=g).item() for s in shapes]
        ts[0] = ts[0].contiguous(memory_format=torch.channels_last)
        ts[3] = ts[3].contiguous(memory_format=torch.channels_last)
        a, b = fp4_format(kind, stochastic=True, seed=1), fp4_format(kind, stochastic=True, seed=1)
        want = [b.round(t) for t in ts]
        got = [t.clone() for t in ts]
        a.round_each_(got, [a.next_key() for _ in got])
        for w, r in zip(want, got):
            assert torch.equal(w.view(torch.int32), r.view(torch.int32)) and w.stride() == r.stride()
