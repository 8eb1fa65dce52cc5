"""The mlnx_qos parser (preflight/parsers/mlnx_qos.py): trust mode and PFC per priority, strict on anything else."""

from __future__ import annotations

import pytest

from preflight.parsers import ParseError, mlnx_qos
from tests.helpers.preflight import fixture_text

pytestmark = pytest.mark.unit


def test_mlnx_qos_trust_and_pfc_per_priority():
    qos = mlnx_qos.parse(fixture_text("mlnx_qos", "cx7-dscp-pfc-3-and-4.txt"))
    assert qos.trust == "dscp" and [p.priority for p in qos.pfc if p.enabled] == [3, 4]
    assert qos.pfc_enabled(3) is True and qos.pfc_enabled(0) is False and qos.pfc_enabled(9) is None
    no_buffer = mlnx_qos.parse(fixture_text("mlnx_qos", "cx5-no-buffer-row-pfc3.txt"))
    assert {p.buffer for p in no_buffer.pfc} == {None} and no_buffer.pfc_enabled(3)


@pytest.mark.parametrize("bad", [
    "Priority trust state: dscp\n",  # no PFC table
    "Priority trust state: both\nPFC configuration:\n\tpriority 0 1\n\tenabled 0 1\n",  # unknown trust state
    "Priority trust state: dscp\nPFC configuration:\n\tpriority 0 1 2\n\tenabled 0 1\n",  # short row
    "Priority trust state: dscp\nPFC configuration:\n\tpriority 0 1\n\tenabled 0 2\n",  # not 0/1
    "Priority trust state: dscp\nwhat is this\nPFC configuration:\n\tpriority 0\n\tenabled 1\n",
])
def test_mlnx_qos_is_strict(bad):
    with pytest.raises(ParseError):
        mlnx_qos.parse(bad)
