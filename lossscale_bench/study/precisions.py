"""The precisions a study may name, each described once (torch-free).

An entry says what a trial in that precision does with numbers: the autocast dtype (by
name), the formats (:mod:`lossscale_bench.precision.formats`, by name) its forward values and its
gradients are rounded to, whether it is a CPU emulation, whether a loss scale has anything
to rescue, Transformer Engine's name for the recipe where there is one, and the report's
note under a table of its rows. ``lossscale_bench.precision.runtime`` builds the runtime object
from it, the schema reads which precisions are emulated, and the report its note; a new
precision is one entry here and its name in ``registry.PRECISIONS``.

Precision options (:class:`PrecisionOption`) are study-row keys that change how a precision
rounds (the FP4 gradients' stochastic rounding, the Hadamard transform of the weight-gradient
inputs). Each is described once here, and an entry names the ones it takes; the scaling
entries' fields, the schema's check, the trial id (a value other than the default), the
default label and the trial's ``get_precision`` call are all derived from this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.float_ranges import RANGES
from ..core.registry import PRECISIONS

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
    #: block scaling of the gradient elements: ``nvfp4`` or ``mxfp4`` (grad_format is then e2m1)
    grad_scaling: str | None = None
    #: ``nvfp4``: forward values in NVFP4 1x16 blocks and weights in 16x16 blocks (forward_format e2m1)
    forward_scaling: str | None = None
    #: the :data:`PRECISION_OPTIONS` a study row in this precision may set
    options: tuple[str, ...] = ()
    #: what the precision is, for readers (the reference pages); an emulation's ``note`` says it there
    doc: str | None = None

    def __post_init__(self) -> None:
        """Refuse, when the table is imported, an entry that would fail every trial or say what a
        trial does not do (a precision described in the table must work at run time)."""
        problems = [
            f"{f} {v!r} is not a format (one of {', '.join(FORMAT_NAMES)}; None for fp32)"
            for f, v in (("forward_format", self.forward_format), ("grad_format", self.grad_format))
            if v is not None and v not in FORMAT_NAMES
        ]
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
                problems.append(
                    f"without emulation nothing rounds: forward_format and grad_format are what "
                    f"autocast computes in ({fmt or 'None'}), or set emulated"
                )
        if self.needs_scaler and self.grad_format is None:
            problems.append("needs_scaler without a grad_format: fp32 gradients have nothing to rescue")
        if problems:
            raise ValueError(f"precision table entry {self.name!r}: " + "; ".join(problems))


@dataclass(frozen=True)
class PrecisionOption:
    """A study-row key that changes how a precision rounds; only precisions naming it accept it."""

    name: str
    #: allowed values, the default first
    choices: tuple
    #: what the option does (the schema's error names the precisions; this is for readers)
    doc: str
    #: words the default label adds for each non-default value
    words: dict

    @property
    def default(self):
        return self.choices[0]


_OPTIONS = (
    PrecisionOption(
        "fp4_rounding",
        ("stochastic", "nearest"),
        "rounding of FP4 gradient elements: stochastic (NVIDIA's NVFP4 recipe, unbiased in expectation) "
        "or to nearest even (the OCP MX conversion)",
        {"nearest": "nearest-rounded grads"},
    ),
    PrecisionOption(
        "wgrad_hadamard",
        (False, True),
        "16x16 random Hadamard transform of the weight-gradient product's gradient input before it is "
        "quantised (NVIDIA's NVFP4 recipe applies it to the wgrad GEMM's inputs)",
        {True: "Hadamard wgrad"},
    ),
    PrecisionOption(
        "mx_exponent",
        ("floor", "ceil"),
        "MXFP4's shared exponent: floor(log2 amax) - 2 (the OCP spec: block maxima with significand "
        "above 1.5 saturate) or rounded up (never saturates, one bit less at the bottom)",
        {"ceil": "MX exponent rounded up"},
    ),
)
#: every precision option, by name (study-row key)
PRECISION_OPTIONS: dict[str, PrecisionOption] = {o.name: o for o in _OPTIONS}


def _fp4(name: str, forward: str, grads: str) -> PrecisionSpec:
    """An FP4 emulation: ``forward`` ``e4m3`` or ``nvfp4``, gradients ``e2m1`` (the loss scale alone), ``nvfp4``
    or ``mxfp4``."""
    what = {
        "e2m1": "plain FP4 E2M1 (no block scale: only the loss scale keeps them in range)",
        "nvfp4": "NVFP4 (E2M1, an E4M3 scale per 16 elements and an fp32 scale per tensor: Transformer "
        "Engine's NVFP4BlockScaling)",
        "mxfp4": "MXFP4 (E2M1, a power-of-two E8M0 scale per 32 elements: OCP MX v1.0)",
    }[grads]
    fwd = (
        "conv/linear outputs rounded to float8 E4M3"
        if forward == "e4m3"
        else "conv/linear outputs in NVFP4 1x16 blocks and weights in NVFP4 16x16 blocks"
    )
    options = ("fp4_rounding", "wgrad_hadamard") + (("mx_exponent",) if grads == "mxfp4" else ())
    return PrecisionSpec(
        name,
        forward_format="e4m3" if forward == "e4m3" else "e2m1",
        grad_format="e2m1",
        emulated=True,
        needs_scaler=True,
        te_format="NVFP4BlockScaling" if grads == forward == "nvfp4" else None,
        grad_scaling=None if grads == "e2m1" else grads,
        forward_scaling="nvfp4" if forward == "nvfp4" else None,
        options=options,
        note=f"these numbers come from the CPU FP4 emulation (compute in fp32, {fwd}, every gradient "
        f"in {what}; gradients rounded stochastically and without the Hadamard transform "
        f"unless a row says otherwise), not real fp4.",
    )


_SPECS = (
    PrecisionSpec("fp32", doc="full fp32 training: nothing is rounded (the baseline rows)."),
    PrecisionSpec(
        "mixed16",
        autocast="float16",
        forward_format="fp16",
        grad_format="fp16",
        needs_scaler=True,
        doc="real fp16 mixed precision: torch.autocast in float16 on the device, fp32 weights.",
    ),
    PrecisionSpec(
        "bf16",
        autocast="bfloat16",
        forward_format="bf16",
        grad_format="bf16",
        doc="real bf16 mixed precision: torch.autocast in bfloat16 on the device, fp32 weights.",
    ),
    PrecisionSpec(
        "fp16-emulated",
        forward_format="fp16",
        grad_format="fp16",
        emulated=True,
        needs_scaler=True,
        note="these numbers come from the CPU fp16 emulation (compute in fp32, fp16 rounding of layer "
        "outputs and gradients), not real fp16.",
    ),
    PrecisionSpec(
        "fp8-emulated",
        forward_format="e4m3",
        grad_format="e5m2",
        emulated=True,
        needs_scaler=True,
        te_format="HYBRID",
        note="these numbers come from the CPU fp8 emulation (compute in fp32, conv/linear outputs "
        "rounded to float8 E4M3, gradients to E5M2: Transformer Engine's Format.HYBRID), "
        "not real fp8.",
    ),
    PrecisionSpec(
        "fp8-e4m3-emulated",
        forward_format="e4m3",
        grad_format="e4m3",
        emulated=True,
        needs_scaler=True,
        te_format="E4M3",
        note="these numbers come from the CPU fp8 emulation with E4M3 everywhere (compute in fp32, "
        "conv/linear outputs and every gradient rounded to float8 E4M3, saturating at +-448 unless "
        "a row says otherwise: Transformer Engine's Format.E4M3), not real fp8.",
    ),
    *(
        _fp4(f"{fwd}fwd-{grads}grad-emulated", fwd, grads)
        for fwd in ("e4m3", "nvfp4")
        for grads in ("e2m1", "nvfp4", "mxfp4")
    ),
)


def _in_registry_order(specs) -> dict[str, PrecisionSpec]:
    """name -> spec in ``registry.PRECISIONS``'s order (where a new entry goes in ``_SPECS`` does not
    matter); a name in one and not the other is a mistake in the recipe, said in one line at import."""
    by_name = {s.name: s for s in specs}
    missing, extra = [p for p in PRECISIONS if p not in by_name], [n for n in by_name if n not in PRECISIONS]
    if missing or extra or len(by_name) != len(specs):
        raise ImportError(
            "registry.PRECISIONS and the table in study/precisions.py disagree: "
            f"no PrecisionSpec for {missing}, not in registry.PRECISIONS: {extra}, or a name twice "
            "(README: Adding a method or a precision)"
        )
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


def precision_option_problems(values: dict, precision: str) -> list[tuple[str, str, str]]:
    """``(option, problem, allowed)`` for each precision option in ``values`` (a scaling entry's
    fields; None: not given) that ``precision`` does not take."""
    takes = PRECISION_SPECS[precision].options
    out = []
    for name in PRECISION_OPTIONS:
        if values.get(name) is not None and name not in takes:
            where = [n for n, s in PRECISION_SPECS.items() if name in s.options]
            out.append((name, f"not an option of {precision}", ", ".join(where)))
    return out


def precision_option_words(scaling: dict) -> list[str]:
    """What a row's default label says about its precision options (those not at their default)."""
    return [
        o.words[scaling[n]]
        for n, o in PRECISION_OPTIONS.items()
        if scaling.get(n) is not None and scaling[n] != o.default and scaling[n] in o.words
    ]


def scaler_grad_format(precision: str) -> str:
    """The name of the gradient format a scaler in ``precision`` works to (its range bounds options)."""
    return PRECISION_SPECS[precision].grad_format or SCALER_DEFAULT_GRAD_FORMAT
