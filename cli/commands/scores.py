"""``clusterctl scores [-i INV] [--consul ADDR] [--watch] [--json]``: the pool as the edge's reader sees it.

Uses the reader library (``edge.pool``): the same view, health folding, staleness and anomaly
verdicts the edge routes on. With an inventory, the Consul address and datacenter come from its
``consul_http_addr`` / ``consul_datacenter`` variables and IUs that publish nothing are listed too.

The table explains each score (drawn by :mod:`cli.views.scores`): the terms it is the sum of, each with
what it adds (drain: ``queue_s + kv_s + step_s + prefill_s``; seed: ``0.3 x kv_cache_gb + 0.5 x
kv_cache_age_s + 0.2 x net_mb_per_s``, shown as ``kv_cache_gb 6 (0.3 x 20)``), the inputs behind them
when the terminal is wide enough, and for an anomaly flag why it was raised. Everything an agent sent is
shown as plain text, never as rich markup. Every component is in ``--json``.

Exit codes: 0 at least one IU publishes a score (or none is expected), 1 IUs are expected (from the
inventory) and none publishes, 2 the ACL token cannot be used (a token file others can read, ...), 3 Consul
cannot be reached. The token: ``--token-file`` (mode 0600), else the inventory's ``consul_token`` (a vault value) or
``consul_token_file`` (0600; the token rule of roles/consul_agent/README.md), else ``CONSUL_HTTP_TOKEN``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cli import app, neterr
from cli.help import examples
from cli.options import vault_password_file_option
from cli.views.scores import publishing, rows, table
from common.errors import ClusterctlError, ExitCode
from common.text import plural
from consul_io import layout
from consul_io.client import ConsulIO, ConsulUnavailable, TokenError, read_token_file
from edge.pool import ConsulWatcher, PoolView


def address_origin(consul_addr: str | None, inventory: str | None, inv_addr: str | None) -> tuple[str, str, str]:
    """(address, where it came from, what to do when it cannot be reached): the first of --consul, the
    inventory's consul_http_addr, CONSUL_HTTP_ADDR and the default. The hint never suggests a setting that
    a higher one overrides (CONSUL_HTTP_ADDR is not read when the inventory names an address)."""
    env = os.environ.get("CONSUL_HTTP_ADDR")
    if consul_addr:
        return consul_addr, "--consul", "address from --consul: check it, and that Consul runs there"
    if inv_addr:
        ignored = f"; CONSUL_HTTP_ADDR={env} is not used: the inventory's address comes first" if env else ""
        return (inv_addr, str(inventory), f"address from consul_http_addr in {inventory}{ignored}; pass --consul "
                "HOST:PORT to reach another")
    if env:
        return env, "CONSUL_HTTP_ADDR", "address from CONSUL_HTTP_ADDR; set it, or pass --consul HOST:PORT"
    return (layout.DEFAULT_HTTP_ADDR, "the default address",
            "the default address (no --consul, no consul_http_addr from -i, no CONSUL_HTTP_ADDR); pass --consul "
            "HOST:PORT, -i INVENTORY, or set CONSUL_HTTP_ADDR")


def _inventory_settings(
    inventory: str, vault_password_file: Path | None = None
) -> tuple[str | None, str | None, Any, dict[str, tuple[str, str]]]:
    """(Consul address, datacenter, token, IU id -> (rack, node)) from the inventory; the token is its
    ``consul_token`` / ``consul_token_file`` (the token rule), as the first node's Consul settings."""
    from cluster import load_cluster
    from cluster.ansible import vault

    cluster = load_cluster(inventory, vault_secrets=vault.secrets_for(vault_password_file))
    expected, addr, dc, token = {}, None, None, None
    for node in cluster.nodes():
        # its URL, so consul_scheme (https) is kept, as every other reader of the inventory does
        addr = addr or (node.settings.consul.url if node.settings.consul.http_addr else None)
        dc = dc or node.settings.consul.dc
        token = token or node.settings.consul
        for iu in node.ius:
            expected[iu.id] = (node.rack, node.name)
    return addr, dc, token, expected


PIPED_EVERY_S = 5.0  # --watch off a terminal: one whole table this often (a log grows, nothing is redrawn)


def show(console: Console, frame: Callable[[str], Table], title: str, sleep: Callable[[float], None] = time.sleep,
         clock: Callable[[], float] = time.time) -> None:
    """--watch until Ctrl-C: on a terminal a live table redrawn 4 times a second; anywhere else (a pipe, a log)
    the table as a whole, titled with its time, every :data:`PIPED_EVERY_S` (a live view off a terminal prints
    only when it stops)."""
    if console.is_terminal:
        with Live(frame(""), console=console, refresh_per_second=4) as live:
            while True:
                sleep(0.25)
                live.update(frame(f"{title} - Ctrl-C to stop"))
    while True:
        console.print(frame(f"{title} at {time.strftime('%H:%M:%S', time.localtime(clock()))}"))
        sleep(PIPED_EVERY_S)


@click.command("scores", epilog=examples(
    "clusterctl scores -i inventory/prod",
    "clusterctl scores --consul 127.0.0.1:8500 --watch",
    "CONSUL_HTTP_ADDR=127.0.0.1:8500 clusterctl scores --json",
    note="Exit codes: 0 scores read (at least one IU publishing, or none expected), 1 the inventory's "
         "IUs publish nothing, 2 the token cannot be used, 3 Consul cannot be reached.",
))
@click.option(
    "-i",
    "--inventory",
    default=None,
    type=click.Path(path_type=str),
    help="Ansible inventory: Consul address/datacenter and the IUs expected.",
)
@click.option("--consul", "consul_addr", default=None,
              help="Consul HTTP address HOST:PORT, or https://HOST:PORT for TLS with the system CAs (default: "
                   "the inventory's consul_http_addr, else CONSUL_HTTP_ADDR, else 127.0.0.1:8500).")
@click.option("--dc", "datacenter", default=None, help="Datacenter of the score keys (default dc1).")
@click.option(
    "--token-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="File (mode 0600) holding the Consul ACL token (else the inventory's consul_token or consul_token_file, else "
         "CONSUL_HTTP_TOKEN).",
)
@click.option("--watch", is_flag=True, help="Keep the table live (blocking queries) until Ctrl-C; off a terminal, "
              f"the whole table every {PIPED_EVERY_S:g}s.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@vault_password_file_option
def command(inventory, consul_addr, datacenter, token_file, watch, as_json, vault_password_file) -> None:
    """Show the load scores the EAS agents publish, with health, age and anomaly flags."""
    expected: dict[str, tuple[str, str]] = {}
    inv_addr = inv_dc = inv_token = None
    if inventory:
        inv_addr, inv_dc, inv_token, expected = _inventory_settings(inventory, vault_password_file)
    addr, source, hint = address_origin(consul_addr, inventory, inv_addr)
    dc = str(datacenter or inv_dc or layout.DEFAULT_DATACENTER)
    try:
        if token_file:
            token = read_token_file(token_file)
        elif inv_token is not None:
            token = inv_token.operator_token() or os.environ.get("CONSUL_HTTP_TOKEN") or None
        else:
            token = os.environ.get("CONSUL_HTTP_TOKEN") or None
    except TokenError as exc:
        where = "--token-file" if token_file else str(inventory)
        raise ClusterctlError(f"{where}: {exc}", ExitCode.USAGE) from None
    try:
        # consul_io's address rule: an https:// address is spoken to over HTTPS (dropping the
        # scheme would send the token in cleartext), http:// or none over HTTP
        io = ConsulIO(addr, token=token, timeout_s=3.0)
    except ConsulUnavailable as exc:  # nothing was contacted: the address itself is not one
        raise ClusterctlError(f"{source}: {exc}", ExitCode.USAGE) from None
    addr = io.address
    view = PoolView()
    watcher = ConsulWatcher(view, io, dc=dc)
    try:
        watcher.refresh_once()
    except ConsulUnavailable as exc:
        raise ClusterctlError(neterr.unreachable("Consul", addr, exc, hint), ExitCode.UNREACHABLE) from exc
    console = app.current().console
    if not watch:
        data = rows(view, expected, time.time())
        if as_json:
            click.echo(json.dumps(data, indent=2))
        elif not data:  # an empty frame under the score formula's caption said nothing
            click.echo(f"no IU in Consul at {addr} (datacenter {dc}) and none expected: no agent has registered "
                       "one; -i INVENTORY lists the IUs an inventory expects")
        else:
            console.print(table(data, f"EAS scores ({addr}, {dc})", console.width))
            console.print(Text(f"{publishing(data)} of {plural(len(data), 'IU')} publishing a score"))
        if expected and not publishing(data):
            raise SystemExit(ExitCode.FAILED)
        return
    watcher.start()
    try:
        if as_json:
            while True:
                click.echo(json.dumps(rows(view, expected, time.time())))
                time.sleep(1.0)
        show(console, lambda title: table(rows(view, expected, time.time()), title, console.width),
             f"EAS scores ({addr}, {dc})")
    except KeyboardInterrupt:
        pass
    finally:
        watcher.stop()
