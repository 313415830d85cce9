"""The precisions a study may name, each described once (torch-free).

An entry says what a trial in that precision does with numbers: the autocast dtype (by
name), the formats (:mod:`lossscale_bench.formats`, by name) its forward values and its
gradients are rounded to, whether it is a CPU emulation, whether a loss scale has anything
to rescue, Transformer Engine's name for the recipe where there is one, and the report's
note under a table of its rows. ``lossscale_bench.precision`` builds the runtime object
from it, the schema reads which precisions are emulated, and the report its note; a new
precision is one entry here and its name in ``registry.PRECISIONS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..float_ranges import RANGES
from ..registry import PRECISIONS

#: autocast dtype name -> the format autocast computes in (the ones torch's autocast offers)
AUTOCAST_FORMATS = {"float16": "fp16", "bfloat16": "bf16"}
#: the format names an entry may give (fp32 is None: nothing is rounded)
FORMAT_NAMES = tuple(n for n in RANGES if n != "fp32")


@dataclass(frozen=True)
class PrecisionSpec:
    name: str
    #: torch dtype name of the autocast region (None: no autocast)
    autocast: str | None = None
    #: format of conv/linear outputs (None: fp32)
    forward_format: str | None = None
    #: format of activation and parameter gradients (None: fp32)
    grad_format: str | None = None
    #: computed in fp32 with rounding hooks (a CPU emulation, marked as such in reports)
    emulated: bool = False
    #: whether gradients live in a narrow-range format, so a loss scale is meaningful
    needs_scaler: bool = False
    #: Transformer Engine's ``recipe.Format`` of the same formats (HYBRID, E4M3)
    te_format: str | None = None
    #: the report's footnote for rows in this precision (emulations must say so)
    note: str | None = None

    def __post_init__(self) -> None:
        """Refuse, when the table is imported, an entry that would fail every trial or say what a
        trial does not do (issue 30: a precision described in the table must work at run time)."""
        problems = [f"{f} {v!r} is not a format (one of {', '.join(FORMAT_NAMES)}; None for fp32)"
                    for f, v in (("forward_format", self.forward_format), ("grad_format", self.grad_format))
                    if v is not None and v not in FORMAT_NAMES]
        if self.autocast is not None and self.autocast not in AUTOCAST_FORMATS:
            problems.append(f"autocast {self.autocast!r} is not one of {', '.join(AUTOCAST_FORMATS)} (or None)")
        if self.emulated:
            if self.autocast is not None:
                problems.append("an emulation computes in fp32 and rounds (autocast must be None)")
            if self.forward_format is None and self.grad_format is None:
                problems.append("an emulation rounds something (forward_format, grad_format or both)")
            if not self.note:
                problems.append("an emulation says so under its rows (note)")
        else:
            fmt = AUTOCAST_FORMATS.get(self.autocast)
            if (self.forward_format, self.grad_format) != (fmt, fmt):
                problems.append(f"without emulation nothing rounds: forward_format and grad_format are what "
                                f"autocast computes in ({fmt or 'None'}), or set emulated")
        if self.needs_scaler and self.grad_format is None:
            problems.append("needs_scaler without a grad_format: fp32 gradients have nothing to rescue")
        if problems:
            raise ValueError(f"precision table entry {self.name!r}: " + "; ".join(problems))


_SPECS = (
    PrecisionSpec("fp32"),
    PrecisionSpec("mixed16", autocast="float16", forward_format="fp16", grad_format="fp16", needs_scaler=True),
    PrecisionSpec("bf16", autocast="bfloat16", forward_format="bf16", grad_format="bf16"),
    PrecisionSpec("fp16-emulated", forward_format="fp16", grad_format="fp16", emulated=True, needs_scaler=True,
                  note="these numbers come from the CPU fp16 emulation (compute in fp32, fp16 rounding of layer "
                       "outputs and gradients), not real fp16."),
    PrecisionSpec("fp8-emulated", forward_format="e4m3", grad_format="e5m2", emulated=True, needs_scaler=True,
                  te_format="HYBRID",
                  note="these numbers come from the CPU fp8 emulation (compute in fp32, conv/linear outputs "
                       "rounded to float8 E4M3, gradients to E5M2: Transformer Engine's Format.HYBRID), "
                       "not real fp8."),
    PrecisionSpec("fp8-e4m3-emulated", forward_format="e4m3", grad_format="e4m3", emulated=True, needs_scaler=True,
                  te_format="E4M3",
                  note="these numbers come from the CPU fp8 emulation with E4M3 everywhere (compute in fp32, "
                       "conv/linear outputs and every gradient rounded to float8 E4M3, saturating at +-448 unless "
                       "a row says otherwise: Transformer Engine's Format.E4M3), not real fp8."),
)



def _in_registry_order(specs) -> dict[str, PrecisionSpec]:
    """name -> spec in ``registry.PRECISIONS``'s order (where a new entry goes in ``_SPECS`` does not
    matter); a name in one and not the other is a mistake in the recipe, said in one line at import."""
    by_name = {s.name: s for s in specs}
    missing, extra = [p for p in PRECISIONS if p not in by_name], [n for n in by_name if n not in PRECISIONS]
    if missing or extra or len(by_name) != len(specs):
        raise ImportError("registry.PRECISIONS and the table in study/precisions.py disagree: "
                          f"no PrecisionSpec for {missing}, not in registry.PRECISIONS: {extra}, or a name twice "
                          "(README: Adding a method or a precision)")
    return {p: by_name[p] for p in PRECISIONS}


#: name -> spec, in the registry's order
PRECISION_SPECS: dict[str, PrecisionSpec] = _in_registry_order(_SPECS)

#: the emulated precisions (the options about emulated rounding apply to these only)
EMULATED_PRECISIONS = tuple(n for n, s in PRECISION_SPECS.items() if s.emulated)
#: emulated precisions whose gradients are fp8 (block scaling and E4M3 overflow options apply)
FP8_GRAD_PRECISIONS = tuple(n for n, s in PRECISION_SPECS.items() if s.emulated and s.grad_format in ("e4m3", "e5m2"))
#: precisions whose gradients underflow, so a loss scale is meaningful
SCALED_PRECISIONS = tuple(n for n, s in PRECISION_SPECS.items() if s.needs_scaler)
#: the format the per-layer scalers keep gradients in where a precision has none (fp32): their own
#: default, fp16 (``build_scaler`` passes no format then)
SCALER_DEFAULT_GRAD_FORMAT = "fp16"


def scaler_grad_format(precision: str) -> str:
    """The name of the gradient format a scaler in ``precision`` works to (its range bounds options)."""
    return PRECISION_SPECS[precision].grad_format or SCALER_DEFAULT_GRAD_FORMAT
