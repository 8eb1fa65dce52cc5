"""`clusterctl scores` (cli/commands/scores.py) without a Consul to ask: one line with the address and a hint,
exit 3."""

from __future__ import annotations

import socket

import pytest

from tests.helpers.cli import one_line

pytestmark = pytest.mark.unit


def test_scores_without_consul_is_one_line_with_address_and_hint_exit_3(clusterctl):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = clusterctl("scores", "--consul", f"127.0.0.1:{port}")
    assert code == 3
    assert one_line(err) == (f"error: cannot reach Consul at 127.0.0.1:{port} (connection refused); set --consul "
                             "HOST:PORT, consul_http_addr in the inventory, or CONSUL_HTTP_ADDR")
