"""Text fields as the study file wrote them, not as YAML's implicit typing reads them.

Why: YAML reads ``name: 1.10`` as the float 1.1, ``010`` as 8 and ``1:30`` as 90
(YAML 1.1's octal and base-60 integers), so a study named ``1.10`` silently
shared an experiment with one named ``1.1``. The loader hands the fields that
are text (``name``, ``label``, ``description``) an :class:`AsWritten` string
holding the characters written, with what YAML would have made of them in
``parsed``: a label or description keeps the text as written, and a study name
(an experiment, a folder) that YAML would not read as a string is refused with
the quotes that fix it.
"""

from __future__ import annotations

from typing import Any

#: mapping keys whose plain (unquoted) scalars are kept as written
TEXT_KEYS = frozenset({"name", "label", "description"})


class AsWritten(str):
    """A plain YAML scalar's characters; ``parsed`` is the non-string value YAML would have read."""

    parsed: Any

    def __new__(cls, text: str, parsed: Any) -> AsWritten:
        obj = super().__new__(cls, text)
        obj.parsed = parsed
        return obj
