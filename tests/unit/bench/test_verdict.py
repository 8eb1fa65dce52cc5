"""bench/verdict.py: a number printed beside its met / NOT met never reads as the other side of the limit."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from verdict import MAX_DIGITS, shown  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value, limit, digits, text", [
    (1.997, 2.0, 2, "1.997"),     # agent_overhead printed "2.00% ... (< 2%): met"
    (2.0, 2.0, 2, "2.00"),        # exactly the limit: the usual digits
    (0.504, 0.5, 2, "0.504"),     # "0.50 (target <= 0.5): NOT met" before
    (0.25, 0.5, 2, "0.25"),       # far from the limit: the usual digits
    (1.20046, 1.2, 3, "1.2005"),
    (2.43, 2.0, 2, "2.43"),
    (-0.001, 0.0, 2, "-0.001"),
])
def test_shown_adds_digits_only_where_rounding_would_print_the_limit(value, limit, digits, text):
    assert shown(value, limit, digits) == text


def test_a_value_a_hair_off_the_limit_stops_at_the_digit_cap_and_nan_and_inf_print_as_they_are():
    assert len(shown(2.0 + 1e-12, 2.0, 2).split(".")[1]) == MAX_DIGITS
    assert shown(math.nan, 1.0) == "nan" and shown(math.inf, 1.0) == "inf"
