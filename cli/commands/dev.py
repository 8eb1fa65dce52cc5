"""``clusterctl dev``: development servers. ``dev consul`` runs devconsul, which is NOT Consul.

devconsul follows Consul's documented HTTP API for the endpoints this project uses (KV, txn, agent
services and checks, health, catalog, status) so tests, CI and the demo can run the real py-consul
client against it. Production uses a real Consul agent.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import stat
import threading
from pathlib import Path

import click

from cli.help import SuggestingGroup, examples
from common.errors import ClusterctlError, ExitCode, UsageError
from consul_io import layout

LOG_LEVELS = ("trace", "debug", "info", "warn", "error")


@click.group(name="dev", cls=SuggestingGroup, epilog=examples("clusterctl dev consul --addr 127.0.0.1:8500"))
def command() -> None:
    """Development servers for tests and the demo (not for production)."""


@command.command(
    name="consul",
    epilog=examples("clusterctl dev consul --addr 127.0.0.1:8500 --data-dir .state/devconsul",
                    "CONSUL_HTTP_ADDR=127.0.0.1:8500 clusterctl scores"),
    short_help="A development server speaking Consul's HTTP API (not Consul).",
)
@click.option("--addr", default=layout.DEFAULT_HTTP_ADDR, show_default=True, help="HOST:PORT to listen on.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Persist state here (crash-safe); in memory when omitted.")
@click.option("--acl-token-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Enable ACLs; the file holds the only accepted token (mode 0600).")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="info",
              show_default=True, help="How much the server logs (to stderr).")
@click.option("--allow-remote", is_flag=True, help="Allow listening on a non-loopback address.")
@click.option("--check-update-interval", default="5m", show_default=True,
              help="Consul's check_update_interval: how long an output-only check change waits before "
                   "health/catalog reads see it (0s: at once).")
@click.option("--max-kv-bytes", type=click.IntRange(min=1), default=256 * 2**20, show_default=True,
              help="Most key+value bytes the KV store holds (a write past it is a 413).")
@click.option("--max-kv-keys", type=click.IntRange(min=1), default=200_000, show_default=True,
              help="Most keys the KV store holds.")
def consul(addr: str, data_dir: Path | None, acl_token_file: Path | None, log_level: str,
           allow_remote: bool, check_update_interval: str, max_kv_bytes: int, max_kv_keys: int) -> None:
    """Run a development server that speaks Consul's HTTP API. It is not Consul.

    One node, datacenter dc1, its own leader. Implements /v1/kv, /v1/txn (KV operations),
    /v1/agent (self, members, services, checks, TTL updates, maintenance), /v1/health,
    /v1/catalog and /v1/status as Consul documents them; TTL, HTTP and TCP checks run for real.
    Use it for tests, CI and the demo; production uses a real Consul agent.
    """
    from devconsul.durations import parse_duration
    from devconsul.server import DevConsulServer

    host = _check_addr(addr, allow_remote)
    if allow_remote and host != "localhost" and not ipaddress.ip_address(host).is_loopback and not acl_token_file:
        # Off loopback without ACLs, anyone who reaches the port can write KV (steer traffic).
        raise UsageError("--allow-remote needs --acl-token-file: without ACLs anyone who reaches the port "
                         "can read and write everything")
    try:
        update_interval = parse_duration(check_update_interval)
    except ValueError as exc:
        raise UsageError(f"--check-update-interval {check_update_interval!r}: {exc}") from exc
    token = _read_token(acl_token_file) if acl_token_file else None
    level = {"trace": logging.DEBUG, "warn": logging.WARNING}.get(log_level.lower(), log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s [%(levelname)s] %(name)s: %(message)s")
    server = DevConsulServer(addr=addr, data_dir=data_dir, acl_token=token,
                             check_update_interval=update_interval, max_kv_bytes=max_kv_bytes,
                             max_kv_keys=max_kv_keys)
    # Exit 2, not 1 (a verdict): the address or the data dir given cannot be used, as with a bad argument.
    try:
        server.start()
    except OSError as exc:
        raise ClusterctlError(f"cannot start on {addr}: {exc.strerror or exc}", ExitCode.USAGE) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterctlError(f"{data_dir}: unreadable state file ({exc}); move it away to start empty",
                              ExitCode.USAGE) from exc
    click.echo(f"devconsul (a development server, not Consul) listening on http://{server.address}"
               f"{' (all interfaces)' if host in ('0.0.0.0', '::') else ''}", err=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        server.stop()


def _check_addr(addr: str, allow_remote: bool) -> str:
    host, sep, port = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--addr {addr!r}: expected HOST:PORT, e.g. 127.0.0.1:8500")
    if host == "localhost":
        return host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError as exc:
        raise UsageError(f"--addr {addr!r}: HOST must be an IP address or localhost") from exc
    if not loopback and not allow_remote:
        raise UsageError(f"--addr {addr!r} is not a loopback address; pass --allow-remote to listen on it")
    return host


def _read_token(path: Path) -> str:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"{path} is readable by group or others (mode {stat.S_IMODE(mode):04o}); "
                         f"run: chmod 600 {path}")
    token = path.read_text().strip()
    if not token:
        raise UsageError(f"{path} is empty; put the ACL token in it")
    if os.linesep in token or any(c.isspace() for c in token):
        raise UsageError(f"{path} must hold one token without whitespace")
    return token
