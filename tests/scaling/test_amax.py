"""amax: Transformer Engine's scaling factor, current and delayed recipes against amaxes measured
independently (plain autograd hooks), exact unscaling, fp8 rescue, checkpoint continuation.

The reference formula is TE's default scaling-factor computation for ``DelayedScaling``
(``recipe.DelayedScaling(margin=0, amax_history_len=1024, amax_compute_algo="max")``:
``sf = (fp8_max / amax) / 2**margin``, the previous scale kept where amax is 0 or not finite).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lossscale_bench.models import build_model
from lossscale_bench.precision import get_precision
from lossscale_bench.precision.formats import E5M2, FP16
from lossscale_bench.scaling import build_scaler
from lossscale_bench.scaling.amax import AmaxLossScaler, scale_from_amax, scale_from_amax_host, scale_from_finite_amax
from lossscale_bench.scaling.per_layer import LOSS_POINT


def _through_checkpoint(state):
    """What trial.py does with a scaler's state: torch.save, then torch.load(weights_only=True)."""
    import io

    buf = io.BytesIO()
    torch.save({"scaler": state}, buf)
    buf.seek(0)
    return torch.load(buf, map_location="cpu", weights_only=True)["scaler"]


def _pow2_floor(x: float) -> float:
    return 2.0 ** math.floor(math.log2(x))


def _te_scale(amax: float, prev: float, fmax: float, margin: float, pow2: bool = True) -> float:
    if not (amax > 0 and math.isfinite(amax)):
        return prev
    sf = (fmax / amax) / 2.0**margin
    return _pow2_floor(sf) if pow2 else sf


def test_scale_from_amax_is_tes_formula():
    t = torch.tensor
    for amax, margin in [(3.0, 2), (1e-6, 0), (57344.0, 0), (0.37, 5)]:
        got = float(scale_from_amax(t(amax), t(7.0), E5M2.max, margin, True))
        assert got == _te_scale(amax, 7.0, E5M2.max, margin)
        got = float(scale_from_amax(t(amax), t(7.0), FP16.max, margin, False))
        assert got == pytest.approx((FP16.max / amax) / 2**margin, rel=1e-6)
    assert float(scale_from_amax(t(3.0), t(7.0), E5M2.max, 2, True)) == 4096.0  # 57344 / 3 / 4 = 4778.7
    for bad in (0.0, math.inf, math.nan):
        assert float(scale_from_amax(t(bad), t(7.0), E5M2.max, 0, True)) == 7.0


@pytest.mark.parametrize("power_of_two", [False, True])
def test_an_amax_whose_factor_overflows_fp32_gets_fp32s_largest_scale_as_in_te(power_of_two):
    """0 < amax < fmax / FLT_MAX: ``fmax / amax`` is inf in fp32. TE's ``_default_sf_compute`` (and its CUDA
    ``compute_scale_from_amax``) set fp32's largest value there, ``2**127`` as a power of two (the mantissa
    bits masked); the previous scale was kept before."""
    t = torch.tensor
    largest = 2.0**127 if power_of_two else torch.finfo(torch.float32).max
    for fmax in (448.0, E5M2.max, FP16.max):
        edge = float(t(fmax / torch.finfo(torch.float32).max))  # about where the factor overflows
        for amax in (1e-37, 2.0**-149, edge / 2):
            for margin in (0.0, 3.0):
                assert float(scale_from_amax(t(amax), t(7.0), fmax, margin, power_of_two)) == largest, (fmax, amax)
                assert float(scale_from_finite_amax(t(amax), t(7.0), fmax, margin, power_of_two)) == largest
                assert scale_from_amax_host(float(t(amax)), 7.0, fmax, margin, power_of_two) == largest
        # just above the edge the factor is finite: TE's formula, no clamp
        above = float(t(edge * 3))
        want = (fmax / above) if not power_of_two else 2.0 ** math.floor(math.log2(fmax / above))
        assert float(scale_from_amax(t(above), t(7.0), fmax, 0.0, power_of_two)) == pytest.approx(want, rel=1e-6)
    for kept in (0.0, math.inf, math.nan):  # still the previous scale
        assert float(scale_from_amax(t(kept), t(7.0), E5M2.max, 0, power_of_two)) == 7.0


def test_the_host_formula_is_the_tensor_formula_bit_for_bit():
    # amaxes over the fp32 range (subnormals and values just below fmax / 2**k included), four formats'
    # maxima, margins 0-8 (and a fractional one), power of two on and off, and the values TE keeps prev for
    import random

    rng = random.Random(7)
    amaxes = [float(torch.tensor(10.0 ** rng.uniform(-44, 38))) for _ in range(3000)]
    # fmax / 2**k and its fp32 neighbours: scales at and just below or above a power of two, where torch's
    # log2 rounds (a floor taken from frexp alone differs there)
    for m in (448.0, E5M2.max, FP16.max, 6.0):
        for k in range(-20, 40):
            bits = int(torch.tensor(m / 2.0**k, dtype=torch.float32).view(torch.int32))
            amaxes += [float(torch.tensor(b, dtype=torch.int32).view(torch.float32)) for b in range(bits - 3, bits + 4)]
    amaxes += [0.0, math.inf, math.nan, 2.0**-149, 3.4e38]
    n = 0
    for a in amaxes:
        for fmax in (448.0, E5M2.max, FP16.max, 6.0):
            margin = rng.choice([0.0, 0.0, 1.0, 3.0, 8.0, 0.5])
            for p2 in (True, False):
                want = scale_from_amax(torch.tensor(a), torch.tensor(7.0), fmax, margin, p2)
                got = scale_from_amax_host(float(torch.tensor(a)), 7.0, fmax, margin, p2)
                assert torch.tensor(got, dtype=torch.float32).view(torch.int32) == want.view(torch.int32), (
                    a,
                    fmax,
                    margin,
                    p2,
                    got,
                    float(want),
                )
                n += 1
    assert n > 30000


@pytest.mark.parametrize("recipe,margin", [("current", 1.0), ("delayed", 8.0)])
def test_the_host_rule_trains_what_the_tensor_rule_trains(monkeypatch, recipe, margin):
    # on the CPU point_scale does its arithmetic on the host; with it switched off it runs the tensor
    # path other devices run: the same scales, gradients and weights after steps of E4M3 training
    def run(host: bool):
        monkeypatch.setattr(AmaxLossScaler, "host_rule", host)
        torch.manual_seed(0)
        model = build_model("ssd_tiny", num_classes=4, image_size=64, width=8)
        prec = get_precision("fp8-e4m3-emulated")
        prec.prepare(model)
        scaler = build_scaler(
            {"method": "amax", "recipe": recipe, "margin": margin, "history": 3}, model, grad_format=prec.grad_format
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        scales = []
        for step in range(4):
            images = [torch.rand(3, 64, 64, generator=g) * (4.0**step) for _ in range(2)]
            targets = [{"boxes": torch.tensor([[5.0, 6.0, 40.0, 50.0]]), "labels": torch.tensor([1])}] * 2
            opt.zero_grad(set_to_none=True)
            scaler.scale(sum(model(images, targets).values())).backward()
            scaler.step(opt)
            scales.append(dict(scaler.point_scales()))
            scaler.update()
        return scales, torch.cat([p.detach().flatten() for p in model.parameters()])

    (s_host, w_host), (s_tensor, w_tensor) = run(True), run(False)
    assert s_host == s_tensor and len({v for d in s_host for v in d.values()}) > 3
    assert torch.equal(w_host, w_tensor)


def _chain():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3), nn.ReLU(), nn.Conv2d(6, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 5)
    )


LAYERS = ("0", "2", "5")


def _input(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    return torch.randn(2, 3, 8, 8, generator=g) * (10.0 ** ((step % 5) - 2))  # amaxes vary over 4 decades


def _loss(model, step):
    return (model(_input(step)) ** 2).mean()


def _true_amaxes(model, steps: int) -> list[dict[str, float]]:
    """amax of the gradient arriving at each layer's output, per step, by plain autograd hooks."""
    out = []
    for step in range(steps):
        rec: dict[str, float] = {}

        def hook(module, inputs, output, n):
            output.register_hook(lambda g: rec.__setitem__(n, float(g.abs().max())))  # noqa: B023 - this pass's record

        handles = [model[int(n)].register_forward_hook(lambda m, i, o, n=n: hook(m, i, o, n)) for n in LAYERS]
        model.zero_grad(set_to_none=True)
        _loss(model, step).backward()
        for h in handles:
            h.remove()
        out.append(rec)
    model.zero_grad(set_to_none=True)
    return out


def _run(scaler, model, steps, start=0):
    """Steps with lr 0 (so every step sees the same model); per step the absolute scale each layer sent."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sent = []
    for step in range(start, start + steps):
        opt.zero_grad(set_to_none=True)
        scaler.scale(_loss(model, step)).backward()
        scaler.step(opt)
        res = scaler.last_step
        assert not res.overflow
        sent.append({r["layer"]: r["accum_scale"] for r in scaler.layer_table() if r["applied"]})
        scaler.update()
    return sent


@pytest.mark.parametrize("recipe,history,margin", [("current", 1, 0), ("delayed", 3, 2), ("delayed", 1024, 0)])
def test_recipes_against_independently_measured_amaxes(recipe, history, margin):
    model = _chain()
    true = _true_amaxes(model, 9)
    scaler = AmaxLossScaler(model, recipe=recipe, history=history, margin=margin, grad_format=E5M2)
    sent = _run(scaler, model, 9)
    loss_scale, prev = 1.0, {n: 1.0 for n in LAYERS}
    for t in range(9):
        for n in ("2", "5"):  # "0": its input needs no gradient, nothing is sent
            if recipe == "current":
                amax = true[t][n]
            else:
                amax = max([a[n] for a in true[max(0, t - history) : t]], default=0.0)
            prev[n] = _te_scale(amax, prev[n], E5M2.max, margin)
            assert sent[t][n] == prev[n], (t, n)
        # the loss's scale: from earlier steps' amax at the layer the loss feeds ("5")
        window = true[t - 1 : t] if recipe == "current" else true[max(0, t - history) : t]
        loss_scale = _te_scale(max([a["5"] for a in window], default=0.0), loss_scale, E5M2.max, margin)
    assert scaler.current_scale() == _te_scale(
        max(a["5"] for a in (true[-1:] if recipe == "current" else true[max(0, 9 - history) :])),
        loss_scale,
        E5M2.max,
        margin,
    )
    scaler.remove()


def test_unscaled_gradients_are_exact_on_ssd_tiny_and_fp8_scales_follow_e5m2():
    """ssd_tiny (branches, merges, BatchNorm): in fp32 the unscaled gradients are plain autograd's
    (power-of-two scales); under fp8-emulated the loss scale is E5M2's max over the heads' amax."""

    def run(precision, scaler_entry):
        torch.manual_seed(0)
        model = build_model("ssd_tiny", num_classes=4)
        model.train()
        prec = get_precision(precision)
        prec.prepare(model)
        scaler = build_scaler(scaler_entry, model, grad_format=prec.grad_format)
        g = torch.Generator().manual_seed(1)
        images = [torch.rand(3, 128, 128, generator=g) for _ in range(2)]
        targets = [{"boxes": torch.tensor([[10.0, 12.0, 60.0, 70.0]]), "labels": torch.tensor([1])}] * 2
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        for _ in range(2):  # the second step's loss scale comes from the first step's amax
            opt.zero_grad(set_to_none=True)
            scaler.scale(sum(model(images, targets).values())).backward()
            scaler.step(opt)
            res = scaler.last_step
            scaler.update()
        assert not res.overflow
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), scaler

    ref, _ = run("fp32", {"method": "none"})
    got, scaler = run("fp32", {"method": "amax", "recipe": "current"})
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-12)
    assert scaler.fmax == FP16.max and scaler.current_scale() > 1.0
    _, fp8 = run("fp8-emulated", {"method": "amax", "recipe": "current", "margin": 8})
    assert fp8.fmax == E5M2.max
    heads = [r for r in fp8.layer_table() if r["layer"].startswith("head") and r["prev_scale"] == fp8.current_scale()]
    assert heads
    scales = list(fp8.point_scales().values())
    assert all(s == _pow2_floor(s) for s in scales)


def test_checkpoint_continues_identically_and_telemetry():
    model = _chain()
    full = AmaxLossScaler(model, recipe="delayed", history=4, margin=1)
    whole = _run(full, model, 10)
    first = AmaxLossScaler(_chain(), recipe="delayed", history=4, margin=1)
    first_model = first._model
    _run(first, first_model, 6)
    state = first.state_dict()
    m2 = _chain()
    resumed = AmaxLossScaler(m2, recipe="delayed", history=4, margin=1)
    resumed.load_state_dict(_through_checkpoint(state))
    assert _run(resumed, m2, 4, start=6) == whole[6:]
    assert resumed.state_dict() == full.state_dict()
    m = full.metrics()
    assert m["loss_scale"] == full.current_scale()
    assert {"amax_point_scale_log2_min", "amax_point_scale_log2_max", "amax_scale_log2_median"} <= set(m)
    rows = full.layer_table()
    assert {r["layer"] for r in rows} == set(LAYERS) and all("amax" in r and "point_scale" in r for r in rows)
    assert set(full.point_scales()) == {LOSS_POINT, *LAYERS}
    for s in (full, first, resumed):
        s.remove()
    with pytest.raises(ValueError, match="recipe"):
        AmaxLossScaler(_chain(), recipe="jit")


@pytest.mark.parametrize("power_of_two", [True, False])
def test_the_rule_for_recorded_amaxes_is_the_rule(power_of_two):
    # scale_from_finite_amax is scale_from_amax wherever amax is finite and not negative: every recorded amax
    g = torch.Generator().manual_seed(0)
    logs = torch.rand(3000, generator=g, dtype=torch.float64) * 280 - 150
    edges = [0.0, -0.0, 1e-45, 1e-40, 2.0**-126, 3.4e38, 448.0, 57344.0, 65504.0]
    amax = torch.cat([torch.exp2(logs).to(torch.float32), torch.tensor(edges)])
    amax = amax[torch.isfinite(amax)]
    prev = torch.exp2(torch.randint(-20, 20, amax.shape, generator=g).float())
    for fmax, margin in ((448.0, 0.0), (57344.0, 1.0), (65504.0, 8.0), (6.0, 3.0)):
        want = scale_from_amax(amax, prev, fmax, margin, power_of_two)
        got = scale_from_finite_amax(amax, prev, fmax, margin, power_of_two)
        assert torch.equal(want.view(torch.int32), got.view(torch.int32)), (fmax, margin)


@pytest.mark.parametrize("recipe, history", [("current", 1024), ("delayed", 1), ("delayed", 3), ("delayed", 16)])
@pytest.mark.parametrize("power_of_two", [True, False])
def test_the_next_loss_scale_read_with_the_verdict_is_the_one_update_sets(recipe, history, power_of_two):
    # off the host, step() reads the next loss scale together with the overflow verdict and update() takes it
    # from there: it must be what update() computes from the rolled history, on histories of every shape
    from lossscale_bench.core.host_path import device_path

    scaler = AmaxLossScaler(_chain(), recipe=recipe, history=history, margin=1, power_of_two=power_of_two)
    scaler._ensure(torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    n = scaler._n
    with device_path():
        for _ in range(40):
            rows = torch.rand(history, n, generator=g) * 2.0 ** torch.randint(-8, 8, (history, n), generator=g)
            scaler._hist = torch.where(torch.rand(history, n, generator=g) < 0.2, torch.zeros(()), rows)
            scaler._hist_max = scaler._hist.amax(0)
            scaler._now = torch.rand(n, generator=g) * 2.0 ** torch.randint(-8, 8, (n,), generator=g)
            scaler._scales = torch.rand(n, generator=g) * 1000
            early = scaler._next_loss_scale()
            scaler.update()  # no verdict read: update() computes it itself
            assert scaler._scales[0].view(torch.int32) == early.view(torch.int32)
