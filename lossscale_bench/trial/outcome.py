"""How a trial ended, and the one-line error of a failed one."""

from __future__ import annotations

import errno
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class TrialOutcome:
    trial_id: str
    status: str  # finished | diverged | failed
    steps: int = 0
    final_map: float | None = None
    final_map_50: float | None = None
    best_map: float | None = None
    diverged_step: int | None = None  # metric-history step that broke training (DivergenceHook)
    diverged_reason: str | None = None
    skipped_steps: int = 0
    seconds: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: errno -> what a researcher reads first in a failed trial's error (the OS text follows)
_DISK_ERRORS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file size limit reached (disk full, quota or ulimit -f)",
}


def failure_text(exc: BaseException) -> str:
    """A failed trial's error line: ``Type: message``, led by "disk full" when that is the cause.

    "OSError: [Errno 28] No space left on device" buried in a traceback is easy to read as a
    bug; the cause may also sit under a wrapping error (``__cause__``/``__context__``).
    """
    text = f"{type(exc).__name__}: {exc}"
    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        what = _DISK_ERRORS.get(getattr(e, "errno", None))
        if what is None and "no space left on device" in str(e).lower():
            what = "disk full"
        if what:
            return f"{what}: {text}"
        e = e.__cause__ or e.__context__
    return text
