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


def test_watch_off_a_terminal_prints_whole_tables_as_it_goes(monkeypatch):
    """A live view off a terminal prints only when it stops: `scores --watch | tee log` showed nothing until
    Ctrl-C. Off a terminal each refresh is the whole table, titled with its time, each IU's row one line."""
    import io

    from cli import app
    from cli.commands.scores import PIPED_EVERY_S, show
    from cli.views.scores import table
    from tests.helpers import score_samples

    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = app.make_console(file=out)
    printed_at_each_sleep = []

    def sleep(seconds: float) -> None:
        assert seconds == PIPED_EVERY_S
        printed_at_each_sleep.append(out.getvalue().count("EAS scores (127.0.0.1:8500, dc1) at "))
        if len(printed_at_each_sleep) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        show(console, lambda title: table(score_samples.rows(), title, console.width), "EAS scores (127.0.0.1:8500, dc1)",
             sleep=sleep, clock=lambda: 0.0)
    assert printed_at_each_sleep == [1, 2]  # a table before each wait, not one at the end
    text = out.getvalue()
    assert "\x1b" not in text and "Ctrl-C" not in text
    busy = [line for line in text.splitlines() if "r01n02-iu0 " in line]
    assert len(busy) == 2 and all("busy: 1.9s of its own prompts to prefill" in line for line in busy), busy


def test_nothing_registered_and_nothing_expected_is_one_line_not_an_empty_table(clusterctl, monkeypatch):
    import cli.commands.scores

    monkeypatch.setattr(cli.commands.scores.ConsulWatcher, "refresh_once", lambda self: None)  # Consul: no IU
    code, out, _ = clusterctl("scores", "--consul", "127.0.85.1:8500")
    assert code == 0 and one_line(out) == ("no IU in Consul at 127.0.85.1:8500 (datacenter dc1) and none expected: "
                                           "no agent has registered one; -i INVENTORY lists the IUs an inventory "
                                           "expects")
