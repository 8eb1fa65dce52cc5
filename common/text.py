"""Small wording helpers shared by the CLI and the libraries' messages (plurals, "did you mean")."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def plural(count: int, word: str, many: str | None = None) -> str:
    """``plural(1, "node")`` -> ``"1 node"``, ``plural(4, "node")`` -> ``"4 nodes"``."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


def suggest(value: str, known: Iterable[str]) -> str:
    """``"; did you mean 'chrony'?"`` for a near miss among ``known``, else ``""``."""
    close = difflib.get_close_matches(value, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
