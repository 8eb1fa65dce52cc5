"""`clusterctl preflight parse` (cli/commands/preflight/parse.py) as a user types it: an unknown kind is named
with the nearest one and the list."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_bad_parse_kind_names_kind(clusterctl, tmp_path):
    (tmp_path / "x").write_text("x")
    code, _, err = clusterctl("preflight", "parse", "ncl", str(tmp_path / "x"))
    assert code == 2 and "Invalid value for 'KIND': 'ncl' is unknown; did you mean 'nccl'? (one of: chrony," in err
    code, _, err = clusterctl("preflight", "parse", "zzz", str(tmp_path / "x"))
    assert code == 2 and "Invalid value for 'KIND': 'zzz' is unknown (one of: chrony, cmdline," in err
