"""The one-line :class:`StudyError` and the wording helpers every study module shares."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ERROR_TYPE", "field_error", "fmt_num", "show_value", "StudyError"]


if TYPE_CHECKING:  # imported where used: the data layer reads annotations through this module, and the
    # GPU check (no pydantic there) builds datasets
    from pydantic_core import PydanticCustomError

#: the pydantic error type of a problem already worded for the user (see :func:`field_error`)
ERROR_TYPE = "lsbench"


class StudyError(Exception):
    """A problem with a study file; ``str(e)`` is one line.

    Attributes: ``file``, ``path`` (field path such as ``scaling[2].scale``,
    or ``line 3, column 5`` for YAML syntax, or ``""``), ``problem`` and
    ``allowed`` (``None`` when there is no set or range to name); ``problems``:
    every problem found in the file, this one first (``str(e)`` names only it); ``partial``: the
    study without the keys that failed, for the data checks (:mod:`.partial`), or None.
    """

    def __init__(self, file: str, path: str, problem: str, allowed: str | None = None) -> None:
        self.file = str(file)
        self.path = path
        self.problem = _one_line(problem)
        self.allowed = _one_line(allowed) if allowed else None
        parts = [self.file]
        if path:
            parts.append(path)
        parts.append(self.problem)
        msg = ": ".join(parts)
        if self.allowed:
            msg += f"; allowed: {self.allowed}"
        super().__init__(msg)
        #: every problem found in the file, this one first (``lsbench validate`` prints one line each)
        self.problems: list[StudyError] = [self]
        #: the study validated without the keys that failed, where its data checks can still run on it
        #: (:mod:`.partial`); None otherwise
        self.partial = None

    @classmethod
    def of(cls, problems: list[StudyError]) -> StudyError:
        """The first of ``problems`` (at least one), carrying them all as its ``problems``."""
        first = problems[0]
        first.problems = list(problems)
        return first


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def show_value(v: Any) -> str:
    """A value as the user wrote it (YAML-ish), short."""
    if v is None:
        s = "null"
    elif isinstance(v, bool):
        s = "true" if v else "false"
    elif isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        s = str(int(v))
    else:
        s = repr(v)
    s = _one_line(s)
    return s if len(s) <= 80 else s[:77] + "..."


def fmt_num(x: float | int) -> str:
    """128.0 -> '128', 0.5 -> '0.5'."""
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return repr(x) if isinstance(x, float) else str(x)


def field_error(problem: str, allowed: str | None = None) -> PydanticCustomError:
    """A field problem worded for the user; :func:`~.load._convert` shows it as it is."""
    ctx = {"problem": problem}
    if allowed:
        ctx["allowed"] = allowed
    from pydantic_core import PydanticCustomError

    return PydanticCustomError(ERROR_TYPE, "{problem}", ctx)
