"""The fault suite's ``tally`` fixture (the counting and the summary: tally.py)."""

from __future__ import annotations

import pytest

from tests.helpers.fault_tally import Tally


@pytest.fixture
def tally() -> Tally:
    return Tally()
