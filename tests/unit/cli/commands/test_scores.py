"""`clusterctl scores` (cli/commands/scores.py) without a Consul to ask: one line with the address and a hint,
exit 3."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.helpers.cli import one_line

REPO = Path(__file__).resolve().parents[4]

pytestmark = pytest.mark.unit


def test_scores_without_consul_is_one_line_with_address_and_hint_exit_3(clusterctl):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = clusterctl("scores", "--consul", f"127.0.0.1:{port}")
    assert code == 3
    assert one_line(err) == (f"error: cannot reach Consul at 127.0.0.1:{port} (connection refused); address from "
                             "--consul: check it, and that Consul runs there")


def test_scores_names_the_inventory_address_and_never_suggests_the_variable_it_ignored(
        clusterctl, monkeypatch, tmp_path):
    """The inventory's consul_http_addr comes before CONSUL_HTTP_ADDR: the error says the address came from
    the inventory and that the variable was not used, instead of telling the operator to set it."""
    import shutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inventory = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "virtual", inventory)
    group_vars = inventory / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text().replace('consul_http_addr: "{{ ansible_host }}:8500"',
                                                         f"consul_http_addr: 127.0.0.1:{port}"))
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "127.0.0.1:1")
    code, _, err = clusterctl("scores", "-i", str(inventory))
    assert code == 3
    assert one_line(err) == (
        f"error: cannot reach Consul at 127.0.0.1:{port} (connection refused); address from consul_http_addr in "
        f"{inventory}; CONSUL_HTTP_ADDR=127.0.0.1:1 is not used: the inventory's address comes first; pass "
        "--consul HOST:PORT to reach another")
    from cli.commands.scores import address_origin

    monkeypatch.delenv("CONSUL_HTTP_ADDR")
    assert address_origin(None, None, None)[1:] == ("the default address", (
        "the default address (no --consul, no consul_http_addr from -i, no CONSUL_HTTP_ADDR); pass --consul "
        "HOST:PORT, -i INVENTORY, or set CONSUL_HTTP_ADDR"))
