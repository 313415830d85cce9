"""The batched SSD loss against torchvision's per-image matching and ``SSD.compute_loss``.

Same matches exactly (indices), same losses and gradients within float tolerance, on ssd_tiny's and
ssd300_vgg16's default boxes, with images holding 0, 1 or many boxes, duplicate boxes (two ground
truths forcing the same anchor), a box equal to an anchor, a box at IoU exactly 0.5, a label-0 box,
and constant logits (every negative tied: hard-negative mining must pick the same anchors).
"""

from __future__ import annotations

import pytest
import torch
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.ssd import SSD
from torchvision.ops import boxes as box_ops

from lossscale_bench.models import build_model
from lossscale_bench.models.multibox_loss import BatchedLossSSD, match_anchors, multibox_loss, pad_targets

# (model, image size, feature-map sizes): anchors only, no backbone run
GEOMETRIES = {"ssd_tiny": (64, [8, 4, 2, 1]), "ssd300_vgg16": (300, [38, 19, 10, 5, 3, 1])}


def _anchors(model, size: int, maps: list[int], batch: int) -> list[torch.Tensor]:
    images = ImageList(torch.zeros(batch, 3, size, size), [(size, size)] * batch)
    feats = [torch.zeros(batch, 1, m, m) for m in maps]
    return model.anchor_generator(images, feats)


def _targets(gen: torch.Generator, anchors: torch.Tensor, size: int, counts: list[int]) -> list[dict]:
    out = []
    for i, n in enumerate(counts):
        xy = torch.rand(n, 2, generator=gen) * size * 0.8
        wh = torch.rand(n, 2, generator=gen) * size * 0.5 + 2.0
        boxes = torch.cat([xy, (xy + wh).clamp(max=size)], 1)
        labels = torch.randint(1, 5, (n,), generator=gen)
        if n >= 4 and i % 2 == 0:
            boxes[1] = boxes[0]  # duplicate: both force the same anchor
            a = anchors[len(anchors) // 3]
            boxes[2] = a  # exactly an anchor (IoU 1)
            half = a.clone()
            half[2] = a[0] + (a[2] - a[0]) / 2  # IoU exactly 0.5 with that anchor
            boxes[3] = half
            labels[3] = 0  # matched, but not foreground for classification
        out.append({"boxes": boxes, "labels": labels})
    return out


def _torchvision(model: SSD, targets, head, anchors):
    matched = []
    for a, t in zip(anchors, targets):
        if t["boxes"].numel() == 0:
            matched.append(torch.full((a.size(0),), -1, dtype=torch.int64))
        else:
            matched.append(model.proposal_matcher(box_ops.box_iou(t["boxes"], a)))
    return torch.stack(matched), SSD.compute_loss(model, targets, head, anchors, matched)


def _batched(model: SSD, targets, head, anchors, dense=None):
    anchors = torch.stack(anchors)
    boxes, labels, valid = pad_targets(targets, anchors.device)
    matched = match_anchors(boxes, valid, anchors, model.proposal_matcher.high_threshold)
    return matched, multibox_loss(
        head["bbox_regression"],
        head["cls_logits"],
        anchors,
        boxes,
        labels,
        matched,
        model.box_coder,
        model.neg_to_pos_ratio,
        dense=dense,
    )


def _head(gen, batch, n_anchors, n_classes, constant_logits):
    reg = torch.randn(batch, n_anchors, 4, generator=gen)
    logits = (
        torch.zeros(batch, n_anchors, n_classes)
        if constant_logits
        else torch.randn(batch, n_anchors, n_classes, generator=gen) * 3
    )
    return {"bbox_regression": reg.requires_grad_(), "cls_logits": logits.requires_grad_()}


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "indexed"])
@pytest.mark.parametrize("name", list(GEOMETRIES))
@pytest.mark.parametrize(
    "counts,constant",
    [([0, 1, 7, 30], False), ([5, 0, 1], True), ([0, 0], False), ([1], False), ([12, 12, 3, 40, 0, 2], False)],
)
def test_batched_equals_torchvision(name, counts, constant, dense):
    size, maps = GEOMETRIES[name]
    model = build_model(name, num_classes=5, image_size=size, batched_loss=False)
    gen = torch.Generator().manual_seed(len(counts) * 31 + sum(counts))
    anchors = _anchors(model, size, maps, len(counts))
    targets = _targets(gen, anchors[0], size, counts)
    head = _head(gen, len(counts), anchors[0].shape[0], 5, constant)

    m_ref, ref = _torchvision(model, targets, head, anchors)
    g_ref = torch.autograd.grad(sum(ref.values()), list(head.values()))
    m_new, new = _batched(model, targets, head, anchors, dense)
    g_new = torch.autograd.grad(sum(new.values()), list(head.values()))

    assert torch.equal(m_ref, m_new)
    assert (m_ref >= 0).any() or sum(counts) == 0
    for k in ref:
        torch.testing.assert_close(new[k], ref[k], rtol=1e-5, atol=1e-6)
    for a, b in zip(g_new, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    if constant:  # every negative tied: the same anchors must carry a gradient
        assert torch.equal(g_new[1].abs().sum(-1) > 0, g_ref[1].abs().sum(-1) > 0)


def test_duplicate_boxes_force_the_same_anchor_higher_index_wins():
    size, maps = GEOMETRIES["ssd_tiny"]
    model = build_model("ssd_tiny", num_classes=3, image_size=size, batched_loss=False)
    anchors = _anchors(model, size, maps, 1)
    box = torch.tensor([[3.0, 5.0, 20.0, 30.0]])
    targets = [{"boxes": box.repeat(3, 1), "labels": torch.tensor([1, 2, 1])}]
    ref = model.proposal_matcher(box_ops.box_iou(targets[0]["boxes"], anchors[0]))
    boxes, labels, valid = pad_targets(targets, torch.device("cpu"))
    new = match_anchors(boxes, valid, torch.stack(anchors), 0.5)[0]
    best = box_ops.box_iou(box, anchors[0]).argmax()
    assert int(ref[best]) == 2 and int(new[best]) == 2
    assert torch.equal(ref, new)


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "indexed"])
def test_nonfinite_background_prediction_stays_out(dense):
    """torchvision indexes background anchors away, so an inf regression there changes nothing."""
    size, maps = GEOMETRIES["ssd_tiny"]
    model = build_model("ssd_tiny", num_classes=5, image_size=size, batched_loss=False)
    gen = torch.Generator().manual_seed(3)
    anchors = _anchors(model, size, maps, 2)
    targets = _targets(gen, anchors[0], size, [2, 1])
    head = _head(gen, 2, anchors[0].shape[0], 5, False)
    m_ref, _ = _torchvision(model, targets, head, anchors)
    bg = int((m_ref[0] < 0).nonzero()[0, 0])
    with torch.no_grad():
        head["bbox_regression"][0, bg] = float("inf")
    _, ref = _torchvision(model, targets, head, anchors)
    _, new = _batched(model, targets, head, anchors, dense)
    assert torch.isfinite(ref["bbox_regression"]) and torch.isfinite(new["bbox_regression"])
    torch.testing.assert_close(new["bbox_regression"], ref["bbox_regression"])
    grad = torch.autograd.grad(sum(new.values()), head["bbox_regression"])[0]
    assert torch.isfinite(grad).all() and float(grad[0, bg].abs().sum()) == 0.0


def test_model_forward_same_loss_and_gradients():
    """The whole training forward (transform, backbone, head, anchors) of ssd_tiny, both ways."""
    torch.manual_seed(0)
    ref = build_model("ssd_tiny", num_classes=4, image_size=64, width=4, batched_loss=False)
    new = build_model("ssd_tiny", num_classes=4, image_size=64, width=4, batched_loss=True)
    assert type(new) is BatchedLossSSD and type(ref) is SSD
    new.load_state_dict(ref.state_dict())
    gen = torch.Generator().manual_seed(1)
    images = [torch.rand(3, 64, 64, generator=gen) for _ in range(3)]
    targets = [
        {"boxes": torch.tensor([[4.0, 6.0, 40.0, 50.0], [20.0, 2.0, 60.0, 30.0]]), "labels": torch.tensor([1, 3])},
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)},
        {"boxes": torch.tensor([[10.0, 10.0, 20.0, 22.0]]), "labels": torch.tensor([2])},
    ]
    losses = {}
    for tag, m in (("ref", ref), ("new", new)):
        m.train()
        out = m([im.clone() for im in images], [dict(t) for t in targets])
        sum(out.values()).backward()
        losses[tag] = out
    for k in losses["ref"]:
        torch.testing.assert_close(losses["new"][k], losses["ref"][k], rtol=1e-5, atol=1e-6)
    for (n, p), q in zip(ref.named_parameters(), new.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=n)
    new.eval()
    with torch.no_grad():
        assert isinstance(new(images[:1]), list)  # evaluation: torchvision's forward


def test_degenerate_box_refused_as_torchvision():
    model = build_model("ssd_tiny", num_classes=3, image_size=64, width=4, batched_loss=True)
    model.train()
    bad = [{"boxes": torch.tensor([[10.0, 10.0, 10.0, 20.0]]), "labels": torch.tensor([1])}]
    with pytest.raises(AssertionError, match="positive height and width"):
        model([torch.rand(3, 64, 64)], bad)


def test_batched_loss_option_trial_ids():
    """Which loss ran is in the trial id (the two agree within float tolerance, not bitwise). Not
    given: torchvision's on the CPU backend, so CPU studies keep the ids, and the results, they had
    before the batched loss existed; the batched one on accelerators."""
    from lossscale_bench.study import load_study_text

    text = """
name: mbl
dataset: {name: synthetic, train_images: 8, val_images: 4, image_size: 64}
model: [ssd_tiny]
model_options: {width: 8, image_size: 64EXTRA}
batch_size: [2]
precision: fp32
scaling: [{method: none}]
schedule: {iterations: 3, lr: 0.01}
resources: {backend: BACKEND}
"""

    def trial(extra, backend="cpu"):
        (t,) = load_study_text(text.replace("EXTRA", extra).replace("BACKEND", backend)).trials()
        return t

    plain, true, false = trial(""), trial(", batched_loss: true"), trial(", batched_loss: false")
    assert plain.trial_id == false.trial_id != true.trial_id
    assert plain.model_options == false.model_options == {"width": 8, "image_size": 64}
    assert true.model_options == {"width": 8, "image_size": 64, "batched_loss": True}
    assert type(build_model("ssd_tiny", num_classes=3, **plain.model_options)) is SSD
    assert type(build_model("ssd_tiny", num_classes=3, **true.model_options)) is BatchedLossSSD
    gpu, gpu_false = trial("", "cuda"), trial(", batched_loss: false", "cuda")
    assert gpu.model_options["batched_loss"] is True and "batched_loss" not in gpu_false.model_options
    assert gpu.trial_id != gpu_false.trial_id


def test_dense_path_has_no_data_dependent_shape():
    """On the meta device every op that would read values on the host (nonzero, boolean indexing,
    .item()) fails: the dense path (any device but the CPU) runs there, so it never syncs."""
    size, maps = GEOMETRIES["ssd_tiny"]
    model = build_model("ssd_tiny", num_classes=5, image_size=size, batched_loss=False)
    gen = torch.Generator().manual_seed(5)
    anchors = _anchors(model, size, maps, 3)
    targets = [{k: v.to("meta") for k, v in t.items()} for t in _targets(gen, anchors[0], size, [2, 0, 5])]
    an = torch.stack(anchors).to("meta")
    boxes, labels, valid = pad_targets(targets, torch.device("meta"))
    matched = match_anchors(boxes, valid, an, 0.5)
    head = {k: v.detach().to("meta").requires_grad_() for k, v in _head(gen, 3, an.shape[1], 5, False).items()}
    out = multibox_loss(
        head["bbox_regression"], head["cls_logits"], an, boxes, labels, matched, model.box_coder, model.neg_to_pos_ratio
    )  # dense chosen: not a CPU tensor
    sum(out.values()).backward()
    assert out["classification"].device.type == "meta" and head["cls_logits"].grad is not None
    with pytest.raises(Exception):  # noqa: B017 - the indexed path reads values, which meta tensors refuse (the type is torch's)
        multibox_loss(
            head["bbox_regression"],
            head["cls_logits"],
            an,
            boxes,
            labels,
            matched,
            model.box_coder,
            model.neg_to_pos_ratio,
            dense=False,
        )


def test_fixed_size_transform_is_torchvisions_bit_for_bit():
    from lossscale_bench.models.multibox_loss import fixed_size_transform

    for name, size in (("ssd_tiny", 64), ("ssd300_vgg16", 300)):
        model = build_model(name, num_classes=3, image_size=size, batched_loss=True)
        model.train()
        gen = torch.Generator().manual_seed(4)
        images = [torch.rand(3, size, size, generator=gen) for _ in range(3)]
        targets = [{"boxes": torch.tensor([[1.5, 2.25, 30.0, 40.75]]), "labels": torch.tensor([1])} for _ in range(3)]
        fast_images, fast_targets = fixed_size_transform(model.transform, images, targets)
        ref_images, ref_targets = model.transform(images, [dict(t) for t in targets])
        assert torch.equal(fast_images.tensors, ref_images.tensors)
        assert fast_images.image_sizes == ref_images.image_sizes
        for a, b in zip(fast_targets, ref_targets):
            assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["labels"], b["labels"])
        # another size: torchvision's transform does the resizing
        other = [torch.rand(3, size + 8, size, generator=gen)]
        assert fixed_size_transform(model.transform, other, targets[:1]) is None
