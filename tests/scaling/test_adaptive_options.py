"""Adaptive scaling options read from the authors' code (kumasento/gradient-scaling):

* ``output_scaling``: ``ada_loss_cast`` points on the SSD head outputs and the L2Norm input, scale
  from ``AdaLossChainer.get_loss_scale_by_approx_range`` with ``W = None``
  (``ada_loss/chainer_impl/ada_loss_chainer.py``), lognormal for class scores;
* ``update_count: calls``: ``AdaLoss.is_updating`` / ``get_unbound_loss_scale``
  (``ada_loss/core.py``): a per-layer counter advanced on every call;
* branch merges: ``AdaLossChainer.rescaling`` divides each branch's max by its scale.

Expectations are computed by hand from those formulas (math, not the code under test).
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from helpers import random_detection_batch
from lossscale_bench.models import build_model
from lossscale_bench.precision import install_fp16_emulation
from lossscale_bench.scaling import build_scaler
from lossscale_bench.scaling.adaptive import AdaptiveLossScaler, find_output_points
from lossscale_bench.scaling.adaptive_rule import bound_scale_tensor, branch_target_scale, output_scale_tensor
from lossscale_bench.study import load_study_text

U_MIN, U_MAX = 6.0e-8, 65504.0
#: sqrt(2) * erfinv(1e-3): the reference's n_uf_threshold constant (ADAPTIVE.md: ~1.2533e-3)
K = 1.2533141373155e-3
#: -sqrt(2) * erfinv(2 * 1e-3 - 1) = -Phi^-1(0.001), the standard normal's 0.1% quantile (tables: 3.0902)
Q = 3.090232306167813


# ---------------------------------------------------------------------------
# the output rule (W = None)
def test_plain_output_scale_by_hand():
    g = torch.tensor([1e-6, -1e-6, 1e-6, -1e-6])  # mean 0, population std 1e-6
    s = float(output_scale_tensor(g))
    assert s == pytest.approx(U_MIN / (K * 1e-6), rel=1e-5)  # 47.87...: above 1, below u_max/1e-6
    # bounds as for layers: min(16, 1024/P), power of two
    assert float(bound_scale_tensor(torch.tensor(s), 1.0)) == 32.0 / 2  # 16
    assert float(bound_scale_tensor(torch.tensor(s), 256.0)) == 4.0
    # the mean does not enter (std, not the RMS ADAPTIVE.md uses for layers): shifting g keeps s
    assert float(output_scale_tensor(g + 3e-6)) == pytest.approx(s, rel=1e-4)


def test_lognormal_output_scale_by_hand():
    e = math.e
    g = torch.tensor([e**-10, -(e**-12), 0.0, e**-14])  # log|g| over non-zeros: -10, -12, -14
    mu, sigma = -12.0, math.sqrt(8.0 / 3.0)
    expect = math.exp(math.log(U_MIN) - mu + sigma * Q)
    assert float(output_scale_tensor(g, lognormal=True)) == pytest.approx(expect, rel=1e-4)
    assert expect == pytest.approx(1.518, abs=2e-3)


def test_output_scale_caps_and_degenerate_cases():
    # overflow cap: u_max / max|g| (no fan-in without a weight). Lognormal statistics of 99 x 1e-7 and
    # one 1e4 ask for exp(ln 6e-8 + 15.87 + 2.52 Q) ~ 1.1e3; the cap is 6.55
    g = torch.tensor([1e-7] * 99 + [1e4])
    logs = torch.tensor([math.log(1e-7)] * 99 + [math.log(1e4)], dtype=torch.float64)
    uncapped = math.exp(math.log(U_MIN) - float(logs.mean()) + float(logs.std(unbiased=False)) * Q)
    assert uncapped > 1000
    assert float(output_scale_tensor(g, lognormal=True)) == pytest.approx(U_MAX / 1e4, rel=1e-6)
    # never below 1 from the underflow side
    assert float(output_scale_tensor(torch.tensor([1.0, -1.0]))) == 1.0
    # all zero (no non-zero entry / zero std) -> 1, as the reference
    assert float(output_scale_tensor(torch.zeros(5))) == 1.0
    assert float(output_scale_tensor(torch.zeros(5), lognormal=True)) == 1.0
    assert float(output_scale_tensor(torch.tensor([0.0, 3e-7, 0.0]), lognormal=True)) == 1.0  # sigma 0
    assert float(output_scale_tensor(torch.tensor([1.0, float("inf")]))) == 1.0
    # E5M2's range (fp8-emulated)
    assert float(output_scale_tensor(torch.tensor([1e-6, -1e-6]), u_min=2.0**-16)) == pytest.approx(
        2.0**-16 / (K * 1e-6), rel=1e-5
    )


def test_branch_merge_divides_each_max_by_its_scale():
    """AdaLossChainer.rescaling: max_gs_i = max|g_i| / scale_i; the largest scale with max(max_gs) * scale
    < u_max, else min(scales) halved (while >= 1/8) until it fits."""
    t = branch_target_scale
    # max_gs = [3000/16, 100/4] = [187.5, 25]: 187.5 * 16 = 3000 fits -> 16
    assert float(t(torch.tensor([3000.0, 100.0]), torch.tensor([16.0, 4.0]))) == 16.0
    # max_gs = [60000, 62.5]: 16 * 60000 and 1 * 60000? 60000 < 65504 -> 1
    assert float(t(torch.tensor([60000.0, 1000.0]), torch.tensor([1.0, 16.0]))) == 1.0
    # an already-scaled max times a candidate (not the reference) would say 64 * 1024 >= u_max; the
    # reference's 1024/64 * 64 = 1024 fits
    assert float(t(torch.tensor([1024.0, 1.0]), torch.tensor([64.0, 2.0]))) == 64.0
    # none fits: min(scales) = 1 halved once: 70000 * 0.5 < u_max
    assert float(t(torch.tensor([70000.0, 1.0]), torch.tensor([1.0, 2.0]))) == 0.5


# ---------------------------------------------------------------------------
# the points in real models
_batch = random_detection_batch  # n random images with two boxes each: (images, targets)


def _loss(model, images, targets, factor=1.0):
    return sum(model(images, targets).values()) * factor


def test_points_found_where_the_reference_casts():
    vgg = build_model("ssd300_vgg16", num_classes=4)
    pts = find_output_points(vgg)
    kinds = [k for _, _, k, _ in pts]
    assert kinds.count("l2norm_input") == 1 and kinds.count("class_output") == 6 and kinds.count("box_output") == 6
    assert all(ln == (k == "class_output") for _, _, k, ln in pts)  # lognormal for class scores only
    tiny = build_model("ssd_tiny", num_classes=4)
    assert len(find_output_points(tiny)) == 8  # 4 maps x (class, box); no L2Norm in the toy


def test_output_points_scale_what_arrives_at_the_heads():
    """With output scaling, a head conv receives P * s_point: the point's scale from the gradient's own
    statistics, recomputed here by hand from the gradient captured at that output (loss x 1e-6, so
    that the points have something to rescue: scales above 1)."""
    torch.manual_seed(0)
    model = build_model("ssd_tiny", num_classes=4)
    model.train()
    install_fp16_emulation(model)
    hooks_before = [len(m._forward_hooks) for m in model.modules()]
    scaler = build_scaler({"method": "adaptive", "init_scale": 4.0, "output_scaling": True}, model)
    images, targets = _batch(2, 128)
    captured = {}

    def capture(key):
        def hook(module, inputs, output):  # runs after the scaler's hook: ``output`` is the point's output
            output.register_hook(lambda g: captured.setdefault(key, g.detach().clone()))

        return hook

    hooks = [
        model.head.classification_head.module_list[0].register_forward_hook(capture("cls")),
        model.head.regression_head.module_list[1].register_forward_hook(capture("box")),
    ]
    scaler.scale(_loss(model, images, targets, 1e-6)).backward()
    for h in hooks:
        h.remove()
    rows = {r["layer"]: r for r in scaler.layer_table()}
    assert sum(r["type"] in ("class_output", "box_output") for r in rows.values()) == 8

    def bounded(s):  # min(s, 16, 1024 / P), power of two (P = 4 at the heads)
        return 2.0 ** math.floor(math.log2(min(s, 16.0, 1024.0 / 4.0)))

    # class scores: lognormal statistics of the gradient as it reaches the point (carrying P = 4)
    point, layer = rows["head.classification_head.module_list.0/output"], rows["head.classification_head.module_list.0"]
    assert point["type"] == "class_output" and point["applied"] and point["prev_scale"] == 4.0
    g = captured["cls"]
    nz = g[g != 0].abs().double().log()
    mu, sigma = float(nz.mean()), float(nz.std(unbiased=False))
    s = min(max(math.exp(math.log(U_MIN) - mu + sigma * Q), 1.0), U_MAX / float(g.abs().max()))
    assert s > 2 and point["unbounded_scale"] == pytest.approx(s, rel=1e-3)
    assert point["scale"] == bounded(s)
    assert layer["prev_scale"] == 4.0 * point["scale"]  # the conv's gradient carries the point's scale
    # box offsets: the plain rule, u_min / (k * std(g))
    point, layer = rows["head.regression_head.module_list.1/output"], rows["head.regression_head.module_list.1"]
    g = captured["box"].double()
    s = min(max(U_MIN / (K * float(g.std(unbiased=False))), 1.0), U_MAX / float(g.abs().max()))
    assert s > 16 and point["unbounded_scale"] == pytest.approx(s, rel=1e-3)
    assert point["scale"] == bounded(s) == 16.0 and layer["prev_scale"] == 64.0
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    res = scaler.last_step
    scaler.update()
    assert not res.skipped
    scaler.remove()
    assert [len(m._forward_hooks) for m in model.modules()] == hooks_before  # the point hooks are gone


def _exact(name, size):
    """Forced power-of-two scales at every layer and point: unscaled gradients equal plain backward's."""
    torch.manual_seed(0)
    model = build_model(name, num_classes=4)
    model.train()
    images, targets = _batch(1, size)
    _loss(model, images, targets).backward()
    ref = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    rng = random.Random(0)
    forced: dict[str, float] = {}
    scaler = AdaptiveLossScaler(
        model,
        init_scale=8.0,
        output_scaling=True,
        scale_fn=lambda n, g, w, p: forced.setdefault(n, 2.0 ** rng.randint(-2, 5)),
    )
    scaler.scale(_loss(model, images, targets)).backward()
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    scaler.update()
    for k, r in ref.items():
        got = model.get_parameter(k).grad
        assert float((got - r).norm() / r.norm().clamp_min(1e-30)) <= 1e-6, k
    scaler.remove()
    return forced


def test_output_points_exact_on_ssd_tiny():
    forced = _exact("ssd_tiny", 128)
    assert sum(n.endswith("/output") for n in forced) == 8


class _Tap(nn.Module):
    """The VGG SSD's L2Norm tap in small: a feature map read by a marked identity (then normalised)
    and by the next block, so the point's branch must be merged with the other."""

    def __init__(self):
        super().__init__()
        from lossscale_bench.models.ssd import _L2NormInput

        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.mark = _L2NormInput()
        self.scale_weight = nn.Parameter(torch.full((8,), 20.0))
        self.next = nn.Conv2d(8, 8, 3, padding=1)
        self.register_buffer("probe", torch.randn(8, 8, 8))  # (a squared norm of normalize() is constant)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        tap = self.scale_weight.view(1, -1, 1, 1) * nn.functional.normalize(self.mark(x))
        return ((tap * self.probe).mean() + torch.relu(self.next(x)).mean()) * 1e-3


def test_marked_point_with_a_branch_is_exact():
    torch.manual_seed(0)
    model = _Tap()
    x = torch.randn(2, 3, 8, 8)
    model(x).backward()
    ref = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    forced = {"mark": 32.0, "next": 0.25, "conv": 4.0}
    scaler = AdaptiveLossScaler(model, init_scale=2.0, output_scaling=True, scale_fn=lambda n, g, w, p: forced[n])
    scaler.scale(model(x)).backward()
    assert scaler.metrics()["ada_merge_points"] == 1
    rows = {r["layer"]: r for r in scaler.layer_table()}
    assert rows["mark"]["type"] == "l2norm_input" and rows["mark"]["accum_scale"] == 64.0
    # the merge at relu(conv) takes the larger fitting branch scale: 2 * 32 (the tap) over 2 * 0.25
    assert rows["conv"]["prev_scale"] == 64.0
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    for k, r in ref.items():
        got = model.get_parameter(k).grad
        assert float((got - r).norm() / r.norm().clamp_min(1e-30)) <= 1e-6, k
    scaler.remove()


def test_output_scaling_is_off_by_default_and_state_round_trips():
    torch.manual_seed(0)
    model = build_model("ssd_tiny", num_classes=4)
    plain = AdaptiveLossScaler(model)
    assert not any(r["type"].endswith("_output") for r in plain.layer_table())
    plain.remove()
    scaler = AdaptiveLossScaler(model, output_scaling=True, update_every=3, update_count="calls")
    images, targets = _batch(2, 128)
    scaler.scale(_loss(model, images, targets)).backward()
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    scaler.update()
    state = scaler.state_dict()
    scaler.remove()
    name = "head.regression_head.module_list.1/output"
    assert state["layers"][name]["calls"] == 1 and state["layers"][name]["unbounded"] is not None
    other = AdaptiveLossScaler(model, output_scaling=True, update_every=3, update_count="calls")
    other.load_state_dict(state)
    assert [r for r in other.layer_table() if r["layer"] == name][0]["unbounded_scale"] == pytest.approx(
        state["layers"][name]["unbounded"]
    )
    assert other._by_name[name].calls == 1
    other.remove()


# ---------------------------------------------------------------------------
# update_every: optimizer steps vs the reference's calls per layer
class _Shared(nn.Module):
    """One Linear applied twice per forward (weight sharing): two backward calls per pass."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.lin(self.inp(x))).pow(2).sum()


def _recompute_pattern(update_count, passes_per_step, steps, n=2):
    torch.manual_seed(0)
    model = _Shared()
    scaler = AdaptiveLossScaler(model, update_every=n, update_count=update_count)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    info = scaler._by_name["lin"]
    pattern = []
    for _ in range(steps):
        for _ in range(passes_per_step):
            seen = []
            orig = scaler.layer_factor

            def spy(it, inf, g, w, prev, orig=orig, seen=seen):
                before = scaler.stat_computations
                out = orig(it, inf, g, w, prev)
                if inf is info:
                    seen.append(scaler.stat_computations > before)
                return out

            scaler.layer_factor = spy
            scaler.scale(model(torch.randn(3, 4))).backward()
            del scaler.layer_factor  # the class method again
            pattern += seen  # in backward order: the reference's counter advances in the same order
        scaler.step(opt)
        scaler.update()
    scaler.remove()
    return pattern


def test_update_count_calls_is_the_references_counter():
    # reference (ada_loss/core.py): is_updating = cur_iter % N == 0, cur_iter += 1 per call of the layer
    calls = _recompute_pattern("calls", passes_per_step=2, steps=3)
    assert calls == [i % 2 == 0 for i in range(12)]
    # ours by default: every call of a step recomputes on steps 0, 2, ...
    steps = _recompute_pattern("steps", passes_per_step=2, steps=3)
    assert steps == [True] * 4 + [False] * 4 + [True] * 4


def test_update_count_agrees_with_one_call_per_step():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    counts = {}
    for mode in ("steps", "calls"):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        m.load_state_dict(model.state_dict())
        scaler = AdaptiveLossScaler(m, update_every=3, update_count=mode)
        for _ in range(7):
            scaler.scale(m(torch.randn(2, 4)).sum()).backward()
            scaler.step(torch.optim.SGD(m.parameters(), lr=0.0))
            scaler.update()
        counts[mode] = scaler.stat_computations
        scaler.remove()
    assert counts["steps"] == counts["calls"] == 3  # steps 0, 3, 6 (the second layer only has an upstream)


def test_bad_update_count():
    with pytest.raises(ValueError, match="steps, calls"):
        AdaptiveLossScaler(nn.Linear(2, 2), update_count="backwards")


# ---------------------------------------------------------------------------
# the study file
STUDY = """\
name: opts
dataset: synthetic
model: ssd_tiny
batch_size: 8
precision: fp16-emulated
scaling:
  - {method: adaptive}
  - {method: adaptive, %s}
schedule: {iterations: 10, lr: 1e-3}
"""


def test_schema_defaults_keep_ids_and_options_reach_the_trial():
    base = load_study_text(STUDY.replace("  - {method: adaptive, %s}\n", "")).trials()[0]
    # the defaults named explicitly: the same trial as the entry without them (in one study, the two entries
    # would repeat each other and be refused)
    (same,) = load_study_text(
        (STUDY % "output_scaling: false, update_count: steps").replace("  - {method: adaptive}\n", "")
    ).trials()
    assert same.trial_id == base.trial_id and "output_scaling" not in base.scaling
    a, b = load_study_text(STUDY % "output_scaling: true, update_every: 10, update_count: calls").trials()
    assert b.scaling["output_scaling"] is True and b.scaling["update_count"] == "calls"
    assert b.trial_id != a.trial_id and b.label == "adaptive (freq=10, output scaling, per-call count)"


def test_schema_bad_values_are_one_line():
    from lossscale_bench.study import StudyError

    for opt, words in (("update_count: backwards", "steps, calls"), ("output_scaling: maybe", "true, false")):
        with pytest.raises(StudyError) as ei:
            load_study_text(STUDY % opt)
        assert "\n" not in str(ei.value) and words in str(ei.value) and "scaling[1]." in str(ei.value)
