"""The precisions a study may name, each described once (torch-free).

An entry says what a trial in that precision does with numbers: the autocast dtype (by
name), the formats (:mod:`lossscale_bench.precision.formats`, by name) its forward values and its
gradients are rounded to, whether it is a CPU emulation, whether a loss scale has anything
to rescue, Transformer Engine's name for the recipe where there is one, and the report's
note under a table of its rows. ``lossscale_bench.precision.runtime`` builds the runtime object
from it, the schema reads which precisions are emulated, and the report its note and its
emulation mark (:func:`is_emulated`, never the name's suffix); a new precision is one entry
here (:func:`register_precision` registers every entry of the table), or a ``PrecisionSpec`` an
installed distribution names in the entry-point group ``lossscale_bench.precisions``. The orders
in which an emulation may round parameter gradients (:data:`GRAD_ROUNDINGS`) are here too.

Precision options (:class:`PrecisionOption`) are study-row keys that change how a precision
rounds (the FP4 gradients' stochastic rounding, the Hadamard transform of the weight-gradient
inputs). Each is described once here, and an entry names the ones it takes; the scaling
entries' fields, the schema's check, the trial id (a value other than the default), the
default label and the trial's ``get_precision`` call are all derived from this table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..core import plugins
from ..core.float_ranges import RANGES

#: the orders in which an emulated precision rounds parameter gradients: before unscaling (PyTorch AMP's
#: order, the default) or after (Chainer's); precision/runtime.py's module doc
GRAD_ROUNDINGS = ("before_unscale", "after_unscale")

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
        problems += self._direction_problems()
        if self.needs_scaler and self.grad_format is None:
            problems.append("needs_scaler without a grad_format: fp32 gradients have nothing to rescue")
        if problems:
            raise ValueError(f"precision table entry {self.name!r}: " + "; ".join(problems))

    def _direction_problems(self) -> list[str]:
        """A name that says which format each direction has (``e4m3fwd-e2m1grad-emulated``,
        ``e5m2-grads-emulated``) must say it in the order the fields have it: forward values first."""
        fields = {
            "fwd": "nvfp4" if self.forward_scaling == "nvfp4" else self.forward_format or "fp32",
            "grad": self.grad_scaling or self.grad_format or "fp32",
        }
        out = []
        for marker, direction in (("fwd", "forward values"), ("grad", "gradients")):
            m = re.search(rf"(?:^|-)([a-z0-9]+?)[-_]?{marker}s?(?:-|$)", self.name)
            if m and m.group(1) != fields[marker]:
                out.append(f"its name says {m.group(1)} {direction}, its fields {fields[marker]}")
        return out


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


#: what builds a precision's runtime object from its spec
RUNTIME = "lossscale_bench.precision.runtime:get_precision"


def precision_plugin(spec: PrecisionSpec, origin: str = plugins.BUILT_IN) -> plugins.Plugin:
    """The registry's description of the table entry ``spec``."""
    options = tuple(
        plugins.Option(
            o, "choice", PRECISION_OPTIONS[o].default, PRECISION_OPTIONS[o].choices, PRECISION_OPTIONS[o].doc
        )
        for o in spec.options
    )
    doc = (spec.doc or spec.note or "").split(". ")[0].rstrip(".")
    return plugins.Plugin(
        kind="precision", name=spec.name, target=RUNTIME, options=options, origin=origin, description=spec, doc=doc
    )


def register_precision(spec: PrecisionSpec) -> PrecisionSpec:
    """Register the table entry ``spec`` (every entry of ``_SPECS`` is)."""
    p = precision_plugin(spec)
    plugins.register("precision", p.name, p.target, options=p.options, description=spec, doc=p.doc)
    return spec


def _describe_entry_point(name: str, target: str, origin: str) -> plugins.Plugin:
    """An entry point of ``lossscale_bench.precisions``: its value names a ``PrecisionSpec``."""
    from importlib import import_module

    module, attr = target.split(":")
    try:
        spec = getattr(import_module(module), attr)
    except Exception as exc:  # noqa: BLE001 - whatever the plug-in's import raises is its error
        raise plugins.PluginError(f"precision {name!r} ({origin}): cannot load {target}: {exc}") from None
    if not isinstance(spec, PrecisionSpec) or spec.name != name:
        raise plugins.PluginError(f"precision {name!r} ({origin}): {target} is not a PrecisionSpec named {name!r}")
    return precision_plugin(spec, origin)


for _spec in _SPECS:
    register_precision(_spec)
plugins.DESCRIBERS["precision"] = _describe_entry_point


#: every precision name a study may use: the table's, in its order, then the entry points' (their
#: names are read from the installed metadata; their specs are loaded when first needed)
PRECISION_NAMES = plugins.names("precision")
_SPECS_LOADED: dict[str, PrecisionSpec] = {}


def precision_specs() -> dict[str, PrecisionSpec]:
    """name -> spec, in :data:`PRECISION_NAMES`' order (also as ``PRECISION_SPECS``); entry points loaded
    on the first call (a broken one is left out here and named by ``lsbench plugins``). Loaded late
    so that a plug-in's module may import the study layer."""
    return plugins.load_descriptions("precision", PRECISION_NAMES, _SPECS_LOADED)


def __getattr__(name: str):
    """``PRECISION_SPECS`` and the tuples derived from it, computed when first read (PEP 562)."""
    specs = precision_specs() if name in _DERIVED else None
    if name == "PRECISION_SPECS":
        return specs
    if name in _DERIVED:
        return tuple(n for n, s in specs.items() if _DERIVED[name](s))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: the tuples of precision names derived from the specs: the emulated precisions (the options about
#: emulated rounding apply to these only), the emulated ones with fp8 gradients (block scaling and
#: E4M3 overflow options apply), those whose gradients underflow (a loss scale is meaningful)
_DERIVED = {
    "PRECISION_SPECS": None,
    "EMULATED_PRECISIONS": lambda s: s.emulated,
    "FP8_GRAD_PRECISIONS": lambda s: s.emulated and s.grad_format in ("e4m3", "e5m2"),
    "SCALED_PRECISIONS": lambda s: s.needs_scaler,
}


def precisions_where(what: str) -> tuple[str, ...]:
    """The precision names of one of the derived tuples (``EMULATED_PRECISIONS``, ``FP8_GRAD_PRECISIONS``,
    ``SCALED_PRECISIONS``), computed now (entry points included)."""
    return tuple(n for n, s in precision_specs().items() if _DERIVED[what](s))


def is_emulated(precision) -> bool:
    """Whether ``precision`` (a name, as a stored run's tag has it) is a CPU emulation, from its table
    entry; a name no entry has is not one."""
    spec = precision_specs().get(precision) if isinstance(precision, str) else None
    return bool(spec is not None and spec.emulated)


#: the format the per-layer scalers keep gradients in where a precision has none (fp32): their own
#: default, fp16 (``build_scaler`` passes no format then)
SCALER_DEFAULT_GRAD_FORMAT = "fp16"


def precision_option_problems(values: dict, precision: str) -> list[tuple[str, str, str]]:
    """``(option, problem, allowed)`` for each precision option in ``values`` (a scaling entry's
    fields; None: not given) that ``precision`` does not take."""
    takes = precision_specs()[precision].options
    out = []
    for name in PRECISION_OPTIONS:
        if values.get(name) is not None and name not in takes:
            where = [n for n, s in precision_specs().items() if name in s.options]
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
    return precision_specs()[precision].grad_format or SCALER_DEFAULT_GRAD_FORMAT
