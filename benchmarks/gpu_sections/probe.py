"""Sections d and g: emulation against reality, the per-layer gradient subnormal and flush rates
(``UnderflowProbe``) of fp16-emulated against real fp16 autocast on the same weights and batches."""

from __future__ import annotations

import copy
import time

from .common import base_model, make_batches

__all__ = ["section_d"]


def _probe_rates(model, backend, precision_name: str, batches: list, seconds: float | None = None) -> tuple[dict, int]:
    """Per-layer rates over ``batches`` and how many batches they cover: with ``seconds``, stopping at
    the first batch that ends more than ``seconds`` after the *first* batch ended (the first call
    compiles the emulation's kernels for every layer shape: on an H100, SSD512's first emulated batch
    took longer than a 54 s share, so a deadline counted from the start covered one batch). The caller
    compares runs over the same batches, so it passes the others the count the first one did."""
    from lossscale_bench.precision import get_precision
    from lossscale_bench.precision.telemetry import UnderflowProbe

    precision = get_precision(precision_name)
    handle = precision.prepare(model)
    probe = UnderflowProbe(model, fmt=precision.telemetry_format)
    model.train()
    probe.arm()
    done, deadline = 0, None
    for images, targets in batches:
        if deadline is not None and time.monotonic() > deadline:
            break
        images, targets = backend.to_device(images, targets)
        model.zero_grad(set_to_none=True)
        with backend.autocast(precision.autocast_dtype):
            parts = model(images, targets)
            loss = sum(parts.values())
        loss.float().backward()  # loss scale 1: the underflow a scaler would have to fix
        done += 1
        if done == 1 and seconds is not None:
            backend.synchronize()
            deadline = time.monotonic() + seconds
    backend.synchronize()
    rates = probe.read()
    probe.remove()
    if handle is not None:
        handle.remove()
    return rates, done


def section_d(cfg: dict, sc: dict) -> dict:
    """Section d (or g, by its config): per-layer rates of fp16-emulated, real fp16 and fp8-emulated,
    and how far the emulation's flush rates are from those real fp16 implies."""
    deadline = time.monotonic() + sc["budget_s"]
    backend, model = base_model(sc["model"], cfg["device"])
    batches = make_batches(sc["model"], sc["batch"], sc["batches"], seed0=500)
    results = {}
    names = ("fp16-emulated", "mixed16", "fp8-emulated")
    for k, name in enumerate(names):
        if time.monotonic() > deadline and results:
            results[name] = None
            continue
        # the emulated fp16 run first, on a share of the budget; the others then see the same batches
        share = (deadline - time.monotonic()) / (len(names) - k) if k == 0 else None
        results[name], done = _probe_rates(copy.deepcopy(model), backend, name, batches, share)
        if k == 0:
            batches = batches[: max(1, done)]
    real, emu, fp8 = results["mixed16"], results["fp16-emulated"], results["fp8-emulated"]
    layers = []
    for layer in emu:
        e, r = emu[layer], (real or {}).get(layer)
        f = (fp8 or {}).get(layer)
        row = {
            "layer": layer,
            "nonzero_emulated": e["nonzero"],
            "underflow_emulated": e["underflow_rate"],
            "flush_emulated": e["flush_rate"],
        }
        if r is not None:
            # real fp16 gradients arrive already rounded: flushed elements are exact zeros, which the
            # probe does not count, so its own flush rate is 0 by construction. The flush rate real
            # fp16 implies is the share of the emulation's non-zero elements that are zero there.
            implied = max(0.0, (e["nonzero"] - r["nonzero"]) / e["nonzero"]) if e["nonzero"] else 0.0
            row.update(
                {
                    "nonzero_real": r["nonzero"],
                    "underflow_real": r["underflow_rate"],
                    "flush_real_probe": r["flush_rate"],
                    "flush_real_implied": implied,
                    "abs_diff_underflow": abs(e["underflow_rate"] - r["underflow_rate"]),
                    "abs_diff_flush": abs(e["flush_rate"] - implied),
                }
            )
        if f is not None:
            row.update({"underflow_fp8_emulated": f["underflow_rate"], "flush_fp8_emulated": f["flush_rate"]})
        layers.append(row)
    with_real = [r for r in layers if "abs_diff_flush" in r and r["nonzero_emulated"] > 0]
    emu_nz = sum(r["nonzero_emulated"] for r in with_real)
    # over the whole model: the share of gradient elements (non-zero before rounding) each run flushed
    overall = {
        "flush_real_implied": (sum(max(0, r["nonzero_emulated"] - r["nonzero_real"]) for r in with_real) / emu_nz)
        if emu_nz
        else None,
        "flush_emulated": (sum(r["flush_emulated"] * r["nonzero_emulated"] for r in with_real) / emu_nz)
        if emu_nz
        else None,
    }
    return {
        "overall": overall,
        "model": sc["model"],
        "batch": sc["batch"],
        "batches": len(batches),
        "loss_scale": 1.0,
        "real": "mixed16 (fp16 autocast on {})".format(cfg["device"]),
        "skipped": [k for k, v in results.items() if v is None],
        "layers": layers,
        "max_abs_diff_flush": max((r["abs_diff_flush"] for r in with_real), default=None),
        "max_abs_diff_underflow": max((r["abs_diff_underflow"] for r in with_real), default=None),
        "mean_abs_diff_flush": (sum(r["abs_diff_flush"] for r in with_real) / len(with_real)) if with_real else None,
    }
