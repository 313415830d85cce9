"""The study file's ``seed_streams`` section: which random streams follow the trial's seed.

Its own module because the schema module had grown past the project's 450 lines; the schema
reads :class:`SeedStreams` as one of its sections.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator

from .errors import field_error, show_value
from .fields import STRICT


def _stream_seed(v: Any):
    """``trial`` (the trial's own seed) or a fixed seed, an integer in [0, 2**32)."""
    if v == "trial" or v is None:
        return v
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32:
        return v
    raise field_error(f"{show_value(v)} is not a seed", "'trial' (the trial's seed) or an integer 0 to 4294967295")


StreamSeed = Annotated[Literal["trial"] | int | None, BeforeValidator(_stream_seed)]


class SeedStreams(BaseModel):
    """Which random streams follow the trial's seed, each on its own (to tell where seed noise
    comes from). ``init``: the initial weights (torch, Python and numpy RNGs before the model is
    built); ``data``: the order of the training batches and their flips; ``val``: the synthetic
    validation set (generated from that seed, as the dataset's own ``seed`` generates it).

    ``trial`` follows the trial's seed; an integer fixes the stream for every seed of the study,
    so the seeds' spread is the other streams' alone. The defaults are what a seed always meant:
    weights and data follow the seed, the validation set is the dataset's (``val`` not given), and
    a study that leaves this section out keeps its trial ids.
    """

    model_config = STRICT

    init: StreamSeed = "trial"
    data: StreamSeed = "trial"
    #: not given: the dataset's own validation set (its ``seed``)
    val: StreamSeed = None

    def given(self) -> dict[str, int | str]:
        """The streams set otherwise than the default, as written: ``{"init": 0}``, ``{"val": "trial"}``.
        This, not the seeds it resolves to, enters the trial id: the seeds of one row then share a
        configuration (``config_id`` leaves out only the seed) and pool in the report."""
        defaults = {"init": "trial", "data": "trial", "val": None}
        return {k: getattr(self, k) for k, d in defaults.items() if getattr(self, k) != d}
