"""Every registered precision rounds to the formats its entry names, and its words name the same ones.

Why: a precision is one table entry (``study/precisions.py``), registered with it
(docs/development/extending.md). An entry that names E4M3 gradients where E5M2 was meant
(its name and note saying E5M2) trains, logs and reports like a correct one, so the trial tests
cannot tell. For each registered precision (from the registry: a new entry is covered with no edit
here):

* its words (name and note; the Transformer Engine recipe where it gives one) name exactly the
  formats its fields name: that mistake is a field disagreeing with what the entry says;
* a forward and backward of a small conv net under the precision captures what it computes: every
  conv/linear output, the gradients arriving at them, the parameter gradients (and, for NVFP4 forward
  values, the rounded weights); every captured element must be representable in the format the entry
  names for its direction, and not all of them in the next narrower format (:data:`NARROWER`).

Representability is judged by references of this file's own (torch's dtype casts, the E2M1 grid, the
block scales searched for), never by the package's rounding, so a format that rounds to another one
is caught too. A direction the entry leaves in fp32 is checked as fp32: its values are not all
fp16 or bf16 values. The precisions computed under autocast (mixed16, bf16) install nothing: what they
claim is the autocast dtype, and their layer outputs and gradients are checked in it the same way
(the parameter gradients too: autocast computes them in its dtype, the fp32 weights receive them cast).
The checks are shown to fail on a wrong entry and on a wrong format, registered here for one test.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from torch import nn

from lossscale_bench.study.precisions import PRECISION_NAMES, PRECISION_SPECS, PrecisionSpec

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
#: relative slack of NVFP4's dequantised values against their block scale: the definition divides by
#: the fp32 tensor scale (``numerics/fp4.py``), one fp32 rounding per element and one in the scale found
NVFP4_RTOL = 2.0**-20
LOSS_SCALE = 2.0**8  # keeps a good share of the gradients inside every format's range


def _cast(dtype):
    return lambda x: (x.to(dtype).to(torch.float32) != x).sum().item()


def _e2m1_bad(x: torch.Tensor) -> int:
    """Elements off +-{0, 0.5, 1, 1.5, 2, 3, 4, 6} (plain E2M1: no scale but the loss scale)."""
    return (~(x.abs().reshape(-1, 1) == E2M1_GRID).any(1)).sum().item()


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` flattened in logical order, zero-padded, as rows of ``block`` elements (NVFP4's and MXFP4's blocks)."""
    flat = x.reshape(-1)
    return torch.nn.functional.pad(flat, (0, -flat.numel() % block)).view(-1, block).abs()


def _tiles16(x: torch.Tensor) -> torch.Tensor:
    """The 16x16 tiles of ``x`` viewed as ``[out, rest]`` (NVFP4 weights), one tile a row."""
    x2 = x.reshape(x.shape[0], -1)
    x2 = torch.nn.functional.pad(x2, (0, -x2.shape[1] % 16, 0, -x2.shape[0] % 16))
    r, c = x2.shape
    return x2.view(r // 16, 16, c // 16, 16).permute(0, 2, 1, 3).reshape(-1, 256).abs()


def _scaled_e2m1_bad(rows: torch.Tensor) -> int:
    """Non-zero elements of the rows (blocks) with no scale ``s`` putting the whole row on the E2M1 grid
    (within :data:`NVFP4_RTOL`): the row's largest element is ``q * s`` for one of the grid's ``q``."""
    amax = rows.amax(1, keepdim=True)
    grid = E2M1_GRID[1:]
    scale = amax.unsqueeze(1) / grid.view(1, -1, 1)  # [rows, candidate, 1]
    r = rows.unsqueeze(1) / torch.where(scale > 0, scale, 1.0)
    q = E2M1_GRID[(r.unsqueeze(-1) - E2M1_GRID).abs().argmin(-1)]
    fits = ((r - q).abs() <= NVFP4_RTOL * q).all(-1).any(1) | (amax.squeeze(1) == 0)
    return (rows[~fits] != 0).sum().item()


def _mxfp4_bad(x: torch.Tensor) -> int:
    """Non-zero elements of 32-element blocks with no power-of-two scale putting the block on the E2M1 grid,
    exactly."""
    rows = _blocks(x, 32)
    amax = rows.amax(1, keepdim=True)
    e = torch.floor(torch.log2(torch.where(amax > 0, amax, 1.0)))
    fits = amax.squeeze(1) == 0
    for k in (-3, -2, -1, 0, 1):  # the block max is q * 2**k with q in [0.5, 6]
        r = torch.ldexp(rows, -(e + k).to(torch.int32))
        fits |= (r.unsqueeze(-1) == E2M1_GRID).any(-1).all(1)
    return (rows[~fits] != 0).sum().item()


#: format name -> the number of elements of an fp32 tensor not representable in it (the references)
BAD = {
    "fp32": _cast(torch.float32),
    "fp16": _cast(torch.float16),
    "bf16": _cast(torch.bfloat16),
    "e4m3": _cast(torch.float8_e4m3fn),
    "e5m2": _cast(torch.float8_e5m2),
    "e2m1": _e2m1_bad,
    "nvfp4": lambda x: _scaled_e2m1_bad(_blocks(x, 16)),
    "nvfp4-w16x16": lambda x: _scaled_e2m1_bad(_tiles16(x)),
    "mxfp4": _mxfp4_bad,
}

#: "All representable in F" cannot tell F from a coarser rounding: a value with fewer mantissa bits (or
#: a coarser block scale) is an F value wherever the ranges overlap. So values named F must also not all
#: be values of the format(s) one step narrower: for element formats the next fewer mantissa bits
#: (fp32 23, fp16 10, bf16 7, E4M3 3, E5M2 2, E2M1 1), taking both where neither holds the other's values
#: (fp16 and bf16 differ in range, E4M3 and E5M2 too), so that every coarser format lies inside one
#: checked here (E5M2, E4M3 and E2M1 values are all bf16 values; E2M1's are all E5M2's). For E2M1's block
#: formats it is the next coarser scale: NVFP4 (any E4M3 scale per 16 elements) -> MXFP4 (a power of two
#: per 32) -> plain E2M1 (none); NVFP4's 16x16 weight tiles -> plain E2M1. E2M1 itself is the narrowest
#: float format there is (one mantissa bit): nothing narrower is checked.
NARROWER = {
    "fp32": ("fp16", "bf16"),
    "fp16": ("bf16",),
    "bf16": ("e4m3", "e5m2"),
    "e4m3": ("e5m2",),
    "e5m2": ("e2m1",),
    "e2m1": (),
    "nvfp4": ("mxfp4",),
    "mxfp4": ("e2m1",),
    "nvfp4-w16x16": ("e2m1",),
}

#: how an entry's name and note write each format (case ignored); a block format's description may
#: also name its element format and its scales' format (:data:`COMPANIONS`)
WORDS = {
    "fp16": r"fp16|(?<!b)float16",
    "bf16": r"bf16|bfloat16",
    "e4m3": "e4m3",
    "e5m2": "e5m2",
    "e2m1": "e2m1",
    "nvfp4": "nvfp4",
    "mxfp4": "mxfp4",
    "e8m0": "e8m0",
}
COMPANIONS = {"nvfp4": {"e2m1", "e4m3"}, "mxfp4": {"e2m1", "e8m0"}}
#: Transformer Engine's recipe formats: (forward, gradients)
TE_FORMATS = {"HYBRID": ("e4m3", "e5m2"), "E4M3": ("e4m3", "e4m3"), "NVFP4BlockScaling": ("nvfp4", "nvfp4")}


def named_formats(spec: PrecisionSpec) -> dict[str, str]:
    """What the entry's fields name for each kind of value (``fp32``: left unrounded)."""
    fwd = "nvfp4" if spec.forward_scaling == "nvfp4" else spec.forward_format or "fp32"
    grads = spec.grad_scaling or spec.grad_format or "fp32"
    out = {"layer outputs": fwd, "gradients arriving at layer outputs": grads, "parameter gradients": grads}
    if spec.forward_scaling == "nvfp4":  # the field's meaning: NVFP4 1x16 outputs, NVFP4 16x16 weights
        out["weights in the forward product"] = "nvfp4-w16x16"
    return out


def word_problems(spec: PrecisionSpec) -> list[str]:
    """Where the entry's name, note or TE recipe name other formats than its fields."""
    named = {f.split("-")[0] for f in named_formats(spec).values()} - {"fp32"}
    allowed = named.union(*(COMPANIONS.get(f, set()) for f in named))
    problems = []
    for where, text in (("name", spec.name), ("note", spec.note or "")):
        said = {f for f, pattern in WORDS.items() if re.search(pattern, text, flags=re.IGNORECASE)}
        if said - allowed:
            problems.append(f"its {where} says {sorted(said - allowed)}, its fields name {sorted(named)}")
        if where == "note" and spec.emulated and named - said:
            problems.append(f"its note does not say {sorted(named - said)}, which its fields name")
    if spec.te_format and TE_FORMATS.get(spec.te_format) != (
        named_formats(spec)["layer outputs"],
        named_formats(spec)["parameter gradients"],
    ):
        problems.append(f"te_format {spec.te_format} is {TE_FORMATS.get(spec.te_format)} in Transformer Engine")
    return problems


class _Recording:
    """A format that records every value its ``round`` returns (the emulation's gradient roundings,
    also inside the FP4 layers' split backward, where no tensor hook sees them)."""

    def __init__(self, fmt, into: list) -> None:
        self._fmt, self._into = fmt, into

    def __getattr__(self, name):
        return getattr(self._fmt, name)

    def round(self, t: torch.Tensor) -> torch.Tensor:
        out = self._fmt.round(t)
        self._into.append(out.detach().clone())
        return out


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 8 * 8, 10),
    )


def captured(name: str) -> dict[str, list[torch.Tensor]]:
    """What one scaled forward and backward in precision ``name`` computes, by kind of value (module doc)."""
    from lossscale_bench.backends.cpu import CPUBackend
    from lossscale_bench.precision import EMULATED_LAYERS, get_precision

    got: dict[str, list[torch.Tensor]] = {k: [] for k in named_formats(PRECISION_SPECS[name])}
    prec = get_precision(name, seed=0)
    if prec.grad_format is not None and prec.emulated:
        prec = replace(prec, grad_format=_Recording(prec.grad_format, got["gradients arriving at layer outputs"]))
    model = _net()
    layers = [m for m in model.modules() if isinstance(m, EMULATED_LAYERS)]

    def on_output(module, inputs, y):  # the gradient reaching the unrounded output is the rounded one
        if y.requires_grad:
            y.register_hook(got["gradients arriving at layer outputs"].append)

    for m in layers:  # before the emulation's hooks
        m.register_forward_hook(on_output)
    handle = prec.prepare(model)
    for m in layers:  # after them: the output the rest of the model sees, the weight the product used
        m.register_forward_hook(lambda m, i, y: got["layer outputs"].append(y.detach()))
        if "weights in the forward product" in got:
            m.register_forward_pre_hook(lambda m, i: got["weights in the forward product"].append(m.weight.detach()))
    x, target = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.zeros(4, 10)
    with CPUBackend(channels_last=False).autocast(prec.autocast_dtype):
        loss = (model(x).float() - target).square().mean()
    (loss * LOSS_SCALE).backward()
    got["parameter gradients"] = [p.grad for p in model.parameters()]
    if handle is not None:
        handle.remove()
    return got


def landing_problems(name: str, formats: dict[str, str] | None = None) -> list[str]:
    """Where precision ``name``'s values are not (all) in the formats its entry names (or ``formats``,
    by kind of value), or all in a narrower one."""
    problems = []
    formats = {**named_formats(PRECISION_SPECS[name]), **(formats or {})}
    for kind, values in captured(name).items():
        fmt = formats[kind]
        if not values:
            problems.append(f"no {kind} were captured")
            continue
        values = [v.detach().to(torch.float32) for v in values]
        x = torch.cat([v.reshape(-1) for v in values])
        if not torch.isfinite(x).all() or (x != 0).sum() < x.numel() // 8:  # too little to judge a format by
            problems.append(f"{kind}: non-finite, or {(x != 0).sum()} of {x.numel()} elements non-zero")
            continue
        bad = sum(BAD[fmt](v) for v in values)
        if bad:
            problems.append(f"{kind}: {bad} of {x.numel()} elements are not {fmt} values")
        for narrow in NARROWER[fmt]:
            if not sum(BAD[narrow](v) for v in values):
                problems.append(f"{kind}: every element is a {narrow} value, not only a {fmt} one")
    return problems


@pytest.mark.parametrize("name", PRECISION_NAMES)
def test_every_precision_says_what_its_fields_name(name):
    assert word_problems(PRECISION_SPECS[name]) == [], name


@pytest.mark.parametrize("name", PRECISION_NAMES)
def test_every_precision_lands_on_the_formats_its_entry_names(name):
    from lossscale_bench.precision import get_precision

    spec, prec = PRECISION_SPECS[name], get_precision(name)
    assert prec.autocast_dtype == (getattr(torch, spec.autocast) if spec.autocast else None)
    if not spec.emulated:  # nothing is installed: autocast (or fp32) computes in the named format itself
        assert prec.prepare(_net()) is None
    assert landing_problems(name) == [], name


def _register(monkeypatch, spec: PrecisionSpec) -> None:
    """``spec`` as a registered precision for one test: its table entry, as the runtime reads it."""
    monkeypatch.setitem(PRECISION_SPECS, spec.name, spec)


def _readme_entry(fix=lambda code: code) -> PrecisionSpec:
    """The README recipe's precision entry, its code passed through ``fix`` first."""
    from test_extending import _recipe_blocks

    code = next(code for path, code in _recipe_blocks() if path.endswith("study/precisions.py"))
    return eval(fix(code), {"PrecisionSpec": PrecisionSpec})[0]  # the block is one line of the table's tuple


def test_the_readme_precision_passes(monkeypatch):
    spec = _readme_entry()
    _register(monkeypatch, spec)
    assert (word_problems(spec), landing_problems(spec.name)) == ([], [])


def _e4m3_for_e5m2(code: str) -> str:
    assert 'grad_format="e5m2"' in code
    return code.replace('grad_format="e5m2"', 'grad_format="e4m3"')


@pytest.mark.parametrize(
    "wrong, says",
    [
        (lambda: _readme_entry(_e4m3_for_e5m2), "e5m2"),  # named and described E5M2, its field E4M3
        (lambda: replace(PRECISION_SPECS["fp8-e4m3-emulated"], name="x-emulated", grad_format="e5m2"), "e4m3"),
    ],
    ids=["says-e5m2-rounds-e4m3", "says-e4m3-rounds-e5m2"],
)
def test_an_entry_whose_fields_name_other_formats_than_it_says_is_caught(monkeypatch, wrong, says):
    """The mistake as a new user makes it: one field naming the other fp8 format. The word check
    catches it; and the gradients are, bit for bit, not what the words say (so the words are no
    cosmetic: judged against them, the values fail). An entry whose name gives the directions it fields
    do not is refused as it is written: that is the earliest catch."""
    try:
        spec = wrong()
    except ValueError as exc:
        assert "its name says" in str(exc)
        return
    _register(monkeypatch, spec)
    assert any("its note" in p for p in word_problems(spec)), word_problems(spec)
    said = dict.fromkeys(("gradients arriving at layer outputs", "parameter gradients"), says)
    problems = landing_problems(spec.name, said)
    assert {p.split(":")[0] for p in problems} == set(said), problems  # both kinds fail, nothing else


@pytest.mark.parametrize(
    "precision, fmt, rounds, problem",
    [
        ("fp8-emulated", "e5m2", "e4m3", "are not e5m2 values"),
        ("fp8-e4m3-emulated", "e4m3", "e5m2", "every element is a e5m2 value"),
    ],
    ids=["e5m2-rounding-e4m3", "e4m3-rounding-e5m2"],
)
def test_a_format_that_rounds_to_another_is_caught(monkeypatch, precision, fmt, rounds, problem):
    """The format table's entry ``fmt`` rounding as ``rounds`` does: the entry is right, the values are not."""
    from lossscale_bench.precision.formats import FORMATS

    monkeypatch.setitem(FORMATS, fmt, replace(FORMATS[rounds], name=fmt))
    problems = landing_problems(precision)
    assert any(problem in p for p in problems), problems


def test_the_references_tell_the_formats_apart():
    """The representability references on values whose formats are known."""

    def one(v):
        return torch.tensor([v])

    cases = {
        1.125: {"e4m3"},
        1.25: {"e4m3", "e5m2"},
        2.0**-12: {"e5m2"},
        512.0: {"e5m2"},
        2.5: {"e4m3", "e5m2"},
        1 + 2.0**-10: set(),
        1.5: {"e4m3", "e5m2", "e2m1"},
    }
    for v, fits in cases.items():
        assert {f for f in ("e4m3", "e5m2", "e2m1") if not BAD[f](one(v))} == fits, v
    assert not BAD["fp16"](one(1 + 2.0**-10)) and BAD["bf16"](one(1 + 2.0**-10))
    block = torch.tensor([6.0, 3.0, 1.5, 0.5, 0.0] * 3 + [4.0])
    assert not BAD["nvfp4"](block * 0.37) and BAD["mxfp4"](torch.cat([block, block]) * 0.37)
    assert not BAD["mxfp4"](torch.cat([block, block]) * 2.0**-5)
    assert BAD["nvfp4"](torch.cat([block[:15], torch.tensor([2.5])]) * 0.37) == 13  # the block's non-zero ones
    tiles = torch.cat([block.repeat(16, 1) * 0.37, block.repeat(16, 1) * 0.11], 1)  # two 16x16 tiles
    rows = block.repeat(16, 1) * torch.tensor([0.37] * 8 + [0.11] * 8).view(16, 1)  # a tile of two scales
    assert not BAD["nvfp4-w16x16"](tiles) and BAD["nvfp4-w16x16"](rows) == 13 * 16 and not BAD["nvfp4"](rows)


@pytest.mark.parametrize(
    "name, fields, says",
    [
        ("e5m2fwd-e4m3grad-emulated", {"forward_format": "e4m3", "grad_format": "e5m2"}, "e5m2 forward values"),
        ("e4m3fwd-e5m2grad-emulated", {"forward_format": "e5m2", "grad_format": "e4m3"}, "e5m2 gradients"),
        ("e4m3fwd-nvfp4grad-emulated", {"forward_format": "e4m3", "grad_format": "e2m1"}, "nvfp4 gradients"),
        ("e5m2-grads-emulated", {"grad_format": "e4m3"}, "e5m2 gradients"),
    ],
)
def test_a_name_that_swaps_the_directions_is_refused(name, fields, says):
    """The set of formats named agrees, the order does not: the table refuses it when it is written
    (the word check above compares sets, so only this one sees which direction has which format)."""
    with pytest.raises(ValueError, match=f"its name says {says}"):
        PrecisionSpec(name, emulated=True, needs_scaler=True, note=f"{name}: e4m3, e5m2", **fields)


def test_the_readme_precision_with_its_directions_swapped_is_refused():
    """The recipe's own entry, renamed as if its directions were the other way round."""
    with pytest.raises(ValueError, match="its name says"):
        _readme_entry(
            lambda code: code.replace('"e5m2-grads-emulated"', '"e4m3fwd-e5m2grad-emulated"').replace(
                'grad_format="e5m2"', 'forward_format="e5m2", grad_format="e4m3"'
            )
        )
