"""The GPU check's markdown: one block per section, from the JSON the sections wrote."""

from __future__ import annotations

from harness import format_cell, markdown_table

__all__ = ["render_markdown"]


def _table(header: list[str], rows: list[list]) -> list[str]:
    return markdown_table(header, rows).split("\n")


def render_markdown(res: dict) -> str:
    """The check's markdown: the header line, then each section's tables (or its error or skip)."""
    m = res["meta"]
    s = res["sections"]
    L = [
        f"### GPU check: {m['device_name']}{' (CPU smoke: tests the script, not figures)' if m['smoke'] else ''}",
        "",
        f"Device `{m['device_name']}`, torch {m['torch']}, torchvision {m['torchvision']}, Python {m['python']}, "
        f"{m['total_s']:.0f} s in all. Command: `{m['command']}`",
        "",
    ]

    def head(key, title):
        L.append(f"**{key}. {title}**" + (f" ({s[key]['seconds']:.0f} s)" if "seconds" in s[key] else ""))
        L.append("")
        if "error" in s[key]:
            L.extend([f"error: `{s[key]['error']}`", ""])
            return None
        if "skipped" in s[key] and isinstance(s[key]["skipped"], str):
            L.extend([f"skipped: {s[key]['skipped']}", ""])
            return None
        return s[key]

    for key in ("a", "h"):
        _render_scaler_match(L, head(key, "torch-style DynamicLossScaler vs torch.amp.GradScaler, step for step"))
    b = head("b", "lsbench Trainer vs plain PyTorch AMP loop, images/s")
    if b:
        L += _table(
            ["model", "loop", "timed steps", "median step (ms)", "images/s"],
            [
                [
                    f"{b['model']} (batch {b['batch']}, {b['precision']})",
                    r["loop"],
                    r["timed_steps"],
                    f"{r['median_step_ms']:.1f}",
                    f"{r['images_per_s']:.1f}",
                ]
                for r in b["rows"]
            ],
        )
        L += [
            "",
            f"Trainer / plain images/s: **{b['ratio_trainer_to_plain_images_per_s']:.3f}**; "
            f"Trainer / its old step (torchvision loss, a read per step): "
            f"{b['ratio_trainer_to_old_step_images_per_s']:.3f}. Timed over blocks of {b['block']} steps, "
            f"each ending in a device sync; lsbench step: {m['lsbench_step']}. The plain loop is "
            "torchvision's references': torchvision's SSD loss, NCHW, torch's default SGD, a loss read "
            "per step.",
            "",
        ]
        _render_profiles(L, b.get("profiles"))
    c = head("c", "adaptive overhead vs dynamic")
    if c:
        L += _table(
            ["model", "method", "timed steps", "median step (ms)", "ratio to dynamic"],
            [
                [
                    f"{r['model']} (batch {r['batch']}, {c['precision']})",
                    r["method"],
                    r["timed_steps"],
                    f"{r['median_step_ms']:.1f}",
                    f"{r['ratio_to_dynamic']:.3f}",
                ]
                for r in c["rows"]
            ],
        )
        L.append("")
        _render_profiles(L, c.get("profiles"))
    for key in ("d", "g"):
        _render_probe(L, head(key, "emulation vs reality: per-layer gradient underflow at loss scale 1"))
    e = head("e", "short fp16 run of the published table's rows")
    if e:
        L.append(
            f"{e['model']}, {e['data']}, batch {e['batch']}, up to {e['iterations_target']} iterations, "
            f"fp16 rows in {e['fp16_precision']}; mAP: {e['map']}."
        )
        L.append("")
        has_map = e["map"] == "computed"
        L += _table(
            ["row", "seed", "steps", "final loss", "mean loss (last 10)", "skipped", "final scale"]
            + (["mAP", "mAP@.5"] if has_map else []),
            [
                [
                    r["label"],
                    r["seed"],
                    r["steps"],
                    r["final_loss"],
                    r["final_loss_mean_last10"],
                    r["skipped_steps"],
                    f"{r['final_scale']:g}",
                ]
                + ([r["map"], r["map_50"]] if has_map else [])
                for r in e["runs"]
            ],
        )
        L.append("")
    f = head("f", "peak memory per method")
    if f:
        L.append(
            f"{f['model']} batch {f['batch']}, {f['precision']}, {f['steps']} steps; {f['rows'][0].get('measure', '')}."
        )
        L.append("")
        L += _table(
            ["method", "peak (MiB)"],
            [
                [
                    r["method"],
                    f"{r['peak_mb']:.0f} ({r['process_peak_mb']:.0f})" if "peak_mb" in r else r.get("skipped"),
                ]
                for r in f["rows"]
            ],
        )
        L.append("")
    return "\n".join(L)


def _render_scaler_match(L: list, a: dict | None) -> None:
    """Sections a and h."""
    if not a:
        return

    L.append(
        f"{a['model']} batch {a['batch']}, {a['precision']}, init scale 65536, growth interval "
        f"{a['growth_interval']}, {a['steps']} steps, {a['skipped_steps']} skipped; SGD options "
        f"{a.get('optimizer')}; parameters finite at the end: {a.get('params_finite')}."
    )
    L.append("")
    L += _table(
        ["scales equal", "skips equal", "max abs param diff", "tolerance", "pass"],
        [
            [
                a["scales_equal"],
                a["skips_equal"],
                f"{a['max_abs_param_diff']:.3g}",
                f"{a['tolerance']:.3g}",
                "**PASS**" if a["pass"] else "**FAIL**",
            ]
        ],
    )
    L += [
        "",
        "scale per step (lsbench = GradScaler where equal): "
        + ", ".join(
            (
                f"{r['scale_lsbench']:g}"
                if r["scale_lsbench"] == r["scale_gradscaler"]
                else f"{r['scale_lsbench']:g}≠{r['scale_gradscaler']:g}"
            )
            + ("*" if r["skipped_lsbench"] else "")
            for r in a["per_step"]
        )
        + " (* skipped)",
        "",
    ]


def _render_profiles(L: list, profiles: dict | None) -> None:
    """Per loop: device time per step, host syncs per step, and the top ops (torch.profiler)."""
    for name, p in (profiles or {}).items():
        syncs = ", ".join(f"{k} {v:.1f}" for k, v in p["host_syncs_per_step"].items()) or "none"
        L.append(
            f"Profile of {name} ({p['steps']} steps): {p['device_self_ms_per_step']:.1f} ms of device "
            f"time per step; host syncs per step: {syncs}."
        )
        L.append("")
        L += _table(
            ["op", "self ms/step", "share", "calls/step"],
            [
                [
                    r["op"].replace("|", "/"),
                    f"{r['self_ms_per_step']:.2f}",
                    f"{r['share']:.1%}",
                    f"{r['calls_per_step']:.1f}",
                ]
                for r in p["top_ops"][:8]
            ],
        )
        L.append("")


def _render_probe(L: list, d: dict | None) -> None:
    """Sections d and g: one model's per-layer rates, emulated vs real."""
    if not d:
        return
    L.append(
        f"{d['model']} batch {d['batch']} x {d['batches']} batch(es); rates among elements non-zero "
        "before rounding. Real fp16 gradients arrive already rounded, so flushed elements are zeros "
        "the probe cannot see: its flush column for real fp16 is the share of the emulation's non-zero "
        "elements that are zero in the real run (same weights, same batches)."
    )
    L.append("")
    L += _table(
        [
            "layer",
            "subnormal emu",
            "subnormal real",
            "flush emu",
            "flush real (implied)",
            "|Δ flush|",
            "subnormal fp8-emu",
            "flush fp8-emu",
        ],
        [
            [r["layer"]]
            + [
                format_cell(r.get(k), "{:.4f}")
                for k in (
                    "underflow_emulated",
                    "underflow_real",
                    "flush_emulated",
                    "flush_real_implied",
                    "abs_diff_flush",
                    "underflow_fp8_emulated",
                    "flush_fp8_emulated",
                )
            ]
            for r in d["layers"]
        ],
    )
    L += [
        "",
        f"Agreement: max |Δ flush| {format_cell(d['max_abs_diff_flush'], '{:.4f}')}, "
        f"mean {format_cell(d['mean_abs_diff_flush'], '{:.4f}')}; "
        f"max |Δ subnormal| {format_cell(d['max_abs_diff_underflow'], '{:.4f}')}. Whole model: real fp16 flushed "
        f"{format_cell(d['overall']['flush_real_implied'], '{:.4f}')} of the non-zero gradient elements, the "
        f"emulation {format_cell(d['overall']['flush_emulated'], '{:.4f}')}."
        + (f" Not run (time budget): {', '.join(d['skipped'])}." if d["skipped"] else ""),
        "",
    ]
