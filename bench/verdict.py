"""A bench's target line: the measured number printed so that it never contradicts its met / NOT met.

Rounded to a table's usual digits, a value just under a limit prints as the limit itself (1.997% as
"2.00% (< 2%): met", 0.504 as "0.50 (<= 0.5): NOT met"): :func:`shown` adds digits until the printed value
is on the same side of the limit as the measured one. Each script words its own verdict.
"""

from __future__ import annotations

import math

MAX_DIGITS = 9


def shown(value: float, limit: float, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals, or with as many more as it takes for the text not to read as
    ``limit`` while ``value`` is not ``limit``."""
    text = f"{value:.{digits}f}"
    if not math.isfinite(value):
        return text
    while value != limit and float(text) == limit and digits < MAX_DIGITS:
        digits += 1
        text = f"{value:.{digits}f}"
    return text

