"""The study's ``resources`` section: where and with what its trials run.

The section's model and the checks that tie it to the scaling entries. ``repeatable: true``
pins the CPU kernels of every process that trains (:mod:`lossscale_bench.core.portable` says which and
why), so that a trial gives the same numbers bit for bit on any x86 machine with AVX2. It is
study-wide, not a scaling entry's (an entry's ``resources`` has no such key): the pins are
environment variables read when torch is first imported, and one Ray job (one study) has one
environment. It enters the trial id when true (:func:`.grid.trial_identity`): on an AVX-512 machine
the pinned trial trains other numbers than the unpinned one, and a study that promises
repeatable numbers must not resume from a result made without the pins. Absent or false, ids
stay as they were.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationInfo, model_validator

from ..core.registry import BACKEND_NAMES
from .errors import StudyError
from .fields import STRICT, Bool, PosFloat, PosInt, choice_field, ctx_source


class Resources(BaseModel):
    model_config = STRICT

    backend: choice_field("backend", BACKEND_NAMES) = "cpu"  # type: ignore[valid-type]
    devices_per_trial: PosInt = 1  # type: ignore[valid-type]
    cpus_per_trial: PosFloat = 1.0  # type: ignore[valid-type]
    #: cuda only: torch.compile the backbone and heads (backends/cuda.py). Off by default and not
    #: in the trial id, as channels_last: the same training, other kernels
    compile: Bool | None = None
    #: cpu only, study-wide: pin torch's, oneDNN's and MKL's CPU kernels at AVX2 (core/portable.py); in
    #: the trial id when true
    repeatable: Bool | None = None

    @model_validator(mode="after")
    def _backend_options(self, info: ValidationInfo):
        if self.compile and self.backend not in ("cuda", "auto"):
            raise StudyError(
                ctx_source(info),
                "resources.compile",
                f"only the cuda backend compiles the model, not {self.backend}",
                "cuda, auto",
            )
        if self.repeatable and self.backend != "cpu":
            raise StudyError(ctx_source(info), "resources.repeatable", _NOT_CPU.format(self.backend), "cpu")
        return self


#: why ``repeatable`` is refused on another backend: it pins CPU kernels, and an accelerator's
#: numbers come from its own kernels (``auto`` may pick one on the worker)
_NOT_CPU = "pins the CPU kernels, so it applies to the cpu backend only, not {}"


def check_repeatable(study, fail) -> None:
    """A ``repeatable`` study whose scaling entry moves its trials to another backend: refused, as
    the study-level backend would be (those trials' numbers would come from other kernels)."""
    if not study.resources.repeatable:
        return
    for k, e in enumerate(study.scaling):
        backend = (e.resources.given() if e.resources is not None else {}).get("backend", "cpu")
        if backend != "cpu":
            fail(f"scaling[{k}].resources.backend", _NOT_CPU.format(backend) + " (resources.repeatable is true)", "cpu")
