"""Small helpers for one-line messages, shared by the study schema and the dataset-file parsers."""

from __future__ import annotations

import difflib
from typing import Any


def suggest(word: Any, names) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``names`` to a mistyped ``word``, else ``""``."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [str(n) for n in names], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
