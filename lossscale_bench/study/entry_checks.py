"""The study's cross-entry checks on scaling entries, run after every field is valid (:class:`.schema.Study`).

Each takes the validated study and ``fail(path, problem, allowed=None)``, which collects one problem a
call, so ``lsbench validate`` names every problem of a file.
"""

from __future__ import annotations

from .methods import default_label
from .precisions import precision_option_problems, precision_specs, precisions_where

__all__ = ["check_grad_rounding", "check_method_options", "unique_labels"]


def unique_labels(study, fail) -> None:
    """Two scaling entries that give different trials under the same label in one report table are refused.

    The report's table is per (model, batch size) and tells same-label rows apart only by
    precision; two entries with equal (model, batch, precision, label) would be two rows
    nobody can tell apart. Entries naming the same trials collapse into one row
    (:func:`~.grid.expand`), so they are not duplicates.
    """
    base_res = study.resources.model_dump(mode="json")
    for model in study.model:
        for bs in study.batch_size:
            seen_trials: set = set()
            owner: dict[tuple, int] = {}  # (model, batch, precision, label) -> entry index
            for k, e in enumerate(study.scaling):
                ov = e.overrides()
                m, b, p = ov.get("model", model), ov.get("batch_size", bs), ov.get("precision", study.precision)
                scaling = e.normalized()
                res = {**base_res, **(e.resources.given() if e.resources is not None else {})}
                trials = (m, b, p, repr(sorted(scaling.items())), repr(sorted(res.items())))
                if trials in seen_trials:
                    continue
                seen_trials.add(trials)
                label = e.label if e.label is not None else default_label(scaling, p)
                j = owner.setdefault((m, b, p, label), k)
                if j != k:
                    how = "its label" if e.label is not None else "its default label"
                    fail(
                        f"scaling[{k}].label" if e.label is not None else f"scaling[{k}]",
                        f"{how} {label!r} is also scaling[{j}]'s for {m} batch {b} {p}: the report could not "
                        f"tell the two rows apart; give one of them a distinct 'label:'",
                    )


def check_method_options(study, fail) -> None:
    """Each method refuses the option combinations that cannot mean what they say in the entry's
    precision (its entry's ``check``)."""
    for k, e in enumerate(study.scaling):
        prec = e.precision if e.precision is not None else study.precision
        e.check(lambda suffix, problem, allowed=None, k=k: fail(f"scaling[{k}]{suffix}", problem, allowed), prec)


def check_grad_rounding(study, fail) -> None:
    """``grad_rounding`` is the order of an *emulated* precision's gradient rounding; a real
    precision's order is the hardware's (AMP: rounded at scale P), so naming one there is a mistake."""
    for k, e in enumerate(study.scaling):
        prec = e.precision if e.precision is not None else study.precision
        for opt, problem, allowed in precision_option_problems(dict(e), prec):
            fail(f"scaling[{k}].{opt}", problem, allowed)
        if e.grad_rounding is not None and prec not in precisions_where("EMULATED_PRECISIONS"):
            fail(
                f"scaling[{k}].grad_rounding",
                f"only for the emulated precisions, but this entry trains in {prec}",
                ", ".join(precisions_where("EMULATED_PRECISIONS")),
            )
        for opt in ("grad_blocks", "block_rounding"):
            if getattr(e, opt) is not None and prec not in precisions_where("FP8_GRAD_PRECISIONS"):
                fail(
                    f"scaling[{k}].{opt}",
                    f"only for the emulated fp8 precisions, but this entry trains in {prec}",
                    ", ".join(precisions_where("FP8_GRAD_PRECISIONS")),
                )
        if e.block_rounding is not None and e.grad_blocks != "mx32":
            fail(f"scaling[{k}].block_rounding", "only meaningful with grad_blocks: mx32")
        if e.grad_overflow is not None and precision_specs()[prec].grad_format != "e4m3":
            fail(
                f"scaling[{k}].grad_overflow",
                f"only for E4M3 gradients, but this entry trains in {prec}",
                ", ".join(n for n, p in precision_specs().items() if p.emulated and p.grad_format == "e4m3"),
            )
