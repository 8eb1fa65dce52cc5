"""``clusterctl scores [-i INV] [--consul ADDR] [--watch] [--json]``: the pool as the edge's reader sees it.

Uses the reader library (``eas_agent.scheduler``): the same view, health folding, staleness and anomaly
verdicts the edge routes on. With an inventory, the Consul address and datacenter come from its
``consul_http_addr`` / ``consul_datacenter`` variables and IUs that publish nothing are listed too.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from cli.errors import ClusterctlError
from cli.options import vault_password_file_option
from eas_agent.consul_io import ConsulIO, ConsulUnavailable
from eas_agent.scheduler import ConsulWatcher, IUEntry, PoolView

HEALTH_STYLE = {"passing": "green", "warning": "yellow", "critical": "red", "maintenance": "magenta"}
# components shown in the table, per profile (everything is in --json)
SHOWN = (
    "queue_s",
    "kv_s",
    "step_s",
    "waiting",
    "running",
    "kv_usage",
    "kv_cache_gb",
    "kv_cache_age_s",
    "net_mb_per_s",
)


def _inventory_settings(
    inventory: str, vault_password_file: Path | None = None
) -> tuple[str | None, str | None, dict[str, tuple[str, str]]]:
    from cluster import load_cluster, vault

    cluster = load_cluster(inventory, vault_secrets=vault.secrets_for(vault_password_file))
    expected, addr, dc = {}, None, None
    for node in cluster.nodes():
        addr = addr or node.vars.get("consul_http_addr")
        dc = dc or node.vars.get("consul_datacenter")
        for iu in node.ius:
            expected[iu.id] = (node.rack, node.name)
    return addr, dc, expected


def entry_json(entry: IUEntry, now: float) -> dict:
    return {
        "iu": entry.iu_id,
        "rack": entry.rack,
        "node": entry.node,
        "score": entry.score,
        "status": entry.status,
        "reason": entry.reason,
        "health": entry.health,
        "age_s": round(now - entry.ts, 3) if entry.ts else None,
        "stale": now > entry.stale_after,
        "anomaly": entry.anomaly,
        "weight": entry.weight,
        "components": entry.components,
    }


def rows(view: PoolView, expected: dict[str, tuple[str, str]], now: float) -> list[dict]:
    out = [entry_json(e, now) for e in view.snapshot().entries]
    seen = {r["iu"] for r in out}
    for iu_id, (rack, node) in sorted(expected.items()):
        if iu_id not in seen:
            out.append(
                {
                    "iu": iu_id,
                    "rack": rack,
                    "node": node,
                    "score": None,
                    "status": None,
                    "reason": "not registered in Consul",
                    "health": "unknown",
                    "age_s": None,
                    "stale": True,
                    "anomaly": None,
                    "weight": None,
                    "components": {},
                }
            )
    return sorted(out, key=lambda r: (r["rack"], r["node"], r["iu"]))


def table(data: list[dict], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for column in ("IU", "rack", "node", "score", "components", "age", "health", "anomaly"):
        t.add_column(column, justify="right" if column in ("score", "age") else "left")
    for r in data:
        comps = "  ".join(f"{k}={r['components'][k]}" for k in SHOWN if r["components"].get(k) is not None)
        age = "-" if r["age_s"] is None else f"{r['age_s']:.1f}s" + (" stale" if r["stale"] else "")
        score = "-" if r["score"] is None else f"{r['score']:.3f}"
        health = r["health"] + (f" ({r['reason']})" if r["reason"] else "")
        t.add_row(
            r["iu"],
            r["rack"],
            r["node"],
            score,
            comps,
            age,
            f"[{HEALTH_STYLE.get(r['health'], 'dim')}]{health}[/]",
            r["anomaly"] or "",
        )
    return t


@click.command("scores")
@click.option(
    "-i",
    "--inventory",
    default=None,
    type=click.Path(path_type=str),
    help="Ansible inventory: Consul address/datacenter and the IUs expected.",
)
@click.option("--consul", "consul_addr", default=None, help="Consul HTTP address HOST:PORT.")
@click.option("--dc", "datacenter", default=None, help="Datacenter of the score keys (default dc1).")
@click.option(
    "--token-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="File holding the Consul ACL token (else CONSUL_HTTP_TOKEN).",
)
@click.option("--watch", is_flag=True, help="Keep the table live (blocking queries) until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@vault_password_file_option
def command(inventory, consul_addr, datacenter, token_file, watch, as_json, vault_password_file) -> None:
    """Show the load scores the EAS agents publish, with health, age and anomaly flags."""
    expected: dict[str, tuple[str, str]] = {}
    inv_addr = inv_dc = None
    if inventory:
        inv_addr, inv_dc, expected = _inventory_settings(inventory, vault_password_file)
    addr = consul_addr or inv_addr or os.environ.get("CONSUL_HTTP_ADDR", "127.0.0.1:8500")
    addr = addr.removeprefix("http://")
    dc = datacenter or inv_dc or "dc1"
    token = Path(token_file).read_text().strip() if token_file else os.environ.get("CONSUL_HTTP_TOKEN")
    view = PoolView()
    watcher = ConsulWatcher(view, ConsulIO(addr, token=token, timeout_s=3.0), dc=dc)
    try:
        watcher.refresh_once()
    except ConsulUnavailable as exc:
        raise ClusterctlError(f"cannot read scores from Consul at {addr}: {exc}", 1) from exc
    if not watch:
        data = rows(view, expected, time.time())
        if as_json:
            click.echo(json.dumps(data, indent=2))
        else:
            Console().print(table(data, f"EAS scores ({addr}, {dc})"))
        return
    watcher.start()
    try:
        if as_json:
            while True:
                click.echo(json.dumps(rows(view, expected, time.time())))
                time.sleep(1.0)
        with Live(table(rows(view, expected, time.time()), ""), refresh_per_second=4) as live:
            while True:
                time.sleep(0.25)
                live.update(
                    table(rows(view, expected, time.time()), f"EAS scores ({addr}, {dc}) - Ctrl-C to stop")
                )
    except KeyboardInterrupt:
        pass
    finally:
        watcher.stop()
