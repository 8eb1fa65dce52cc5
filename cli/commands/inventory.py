"""``clusterctl inventory show|validate``."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.text import Text
from rich.tree import Tree

from cli import app
from cli.help import SuggestingGroup, examples
from cli.options import inventory_option, limit_option, vault_password_file_option
from cluster import servers as srv
from cluster import validate as val
from cluster.ansible import inventory as inv
from cluster.ansible import vault
from cluster.model import Cluster
from common.errors import ExitCode
from common.text import plural


@click.group("inventory", cls=SuggestingGroup, epilog=examples("clusterctl inventory validate -i inventory/prod", "clusterctl inventory show -i inventory/prod --limit rack_r12"))
def command() -> None:
    """Show and validate the cluster model built from an Ansible inventory."""


@command.command("show", epilog=examples("clusterctl inventory show -i inventory/prod --limit rack_r12", "clusterctl inventory show -i mycluster --json"))
@inventory_option
@limit_option
@click.option("--json", "as_json", is_flag=True, help="Print the model as JSON.")
@vault_password_file_option
def show(inventory: str, limit: str | None, as_json: bool, vault_password_file: Path | None) -> None:
    """Draw racks -> nodes -> IUs (GPUs, NUMA node, port, NICs, address)."""
    cluster = inv.load_cluster(inventory, limit, vault.secrets_for(vault_password_file))
    if as_json:
        click.echo(json.dumps(cluster.to_json(), indent=2))
        return
    app.current().console.print(cluster_tree(cluster, inventory))


def cluster_tree(cluster: Cluster, title: str) -> Tree:
    """Inventory values (names, devices, addresses) go in as plain Text: a "[" in one is not markup."""
    nodes = list(cluster.nodes())
    tree = Tree(Text.assemble(
        (title, "bold"),
        f": {plural(len(cluster.racks), 'rack')}, {plural(len(nodes), 'node')}, "
        f"{plural(sum(len(n.ius) for n in nodes), 'IU')}, {plural(sum(n.gpu_count for n in nodes), 'GPU')}",
    ))
    if cluster.consul_servers:
        branch = tree.add(Text(f"Consul servers ({len(cluster.consul_servers)})", style="bold cyan"))
        for server in cluster.consul_servers:
            branch.add(Text.assemble((server.name, "bold"), f" {server.address}  {server.kind}"))
    for rack in cluster.racks:
        rack_branch = tree.add(Text(f"rack {rack.name}", style="bold cyan"))
        for node in rack.nodes:
            node_branch = rack_branch.add(Text.assemble(
                (node.name, "bold"),
                f" {node.address}  {node.gpu_model} x{node.gpu_count}  "
                f"NICs: {', '.join(n.device for n in node.nics) or '-'}",
            ))
            for iu in node.ius:
                node_branch.add(Text.assemble(
                    (iu.id, "green"),
                    f"  GPUs {iu.cuda_visible_devices}  NUMA {iu.numa_node}  port {iu.port}  "
                    f"NICs {', '.join(iu.nics) or '-'}",
                ))
    return tree


def source_of(origin: str | None) -> dict[str, str | int | None]:
    """``file`` (relative to the inventory) and ``line`` of a problem's variable (its ``origin``, or the
    ``where`` of a variable nothing reads), for a CI annotation; None where the inventory does not say."""
    path, _, line = (origin or "").rpartition(":")
    if not line.isdigit():
        return {"file": origin or None, "line": None}
    return {"file": path, "line": int(line)}


@command.command("validate", epilog=examples(
    "clusterctl inventory validate -i inventory/prod",
    "clusterctl inventory validate -i inventory/prod --vault-password-file ~/.vault-pass --json",
    note="With the vault password, vault values are decrypted too: one that does not decrypt, or still holds "
         "a REPLACE-ME placeholder, is a problem. Exit codes: 0 no problem, 2 a problem (every one is listed, "
         "with the file or host and the variable)."))
@inventory_option
@limit_option
@vault_password_file_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the problems (each with the file and line that set it, where known), warnings and "
                   "notes as JSON (stdout).")
def validate(inventory: str, limit: str | None, vault_password_file: Path | None, as_json: bool) -> None:
    """Report every inventory problem at once (exit 2 if any)."""
    loaded = inv.load_inventory(inventory, limit, vault.secrets_for(vault_password_file), check_vault=True)
    problems = inv.problems_of(loaded) + loaded.placeholders
    # without any vault password a sealed value is not a problem here (validate needs none); with one, a
    # value it does not decrypt is what provision would stop on
    sealed = loaded.undecryptable if loaded.placeholders_checked else []
    lines = val.problem_lines(problems) + sealed
    consul_servers = srv.servers_of(loaded.selected, loaded.groups.get(srv.SERVERS_GROUP))
    warnings = [] if lines else val.security_warnings(loaded.selected)
    notes = [f"{plural(loaded.sealed, 'vault-encrypted value')} not checked for placeholders (no vault password: "
             "pass --vault-password-file to check them)"] if loaded.sealed and not loaded.placeholders_checked else []
    if as_json:
        click.echo(json.dumps({
            "inventory": str(loaded.path), "ok": not lines, "hosts": len(loaded.selected),
            "problems": [{"where": p.host, "where_kind": p.place_kind, "variable": p.variable, "message": p.message,
                          **source_of(p.host if p.place_kind == "file" else p.origin)} for p in problems]
                        + [{"where": None, "where_kind": "vault", "variable": None, "message": line, "file": None,
                            "line": None} for line in sealed],
            "warnings": warnings, "notes": notes, "consul_servers": [s.to_json() for s in consul_servers],
        }, indent=2))
        if lines:
            raise SystemExit(ExitCode.USAGE)
        return
    if lines:
        for line in lines:
            click.echo(f"{loaded.path}: {line}", err=True)
        count = len(problems) + len(sealed)
        shown = f" ({len(lines)} distinct)" if len(lines) < count else ""
        click.echo(f"{plural(count, 'problem')}{shown} in {loaded.path}", err=True)
        raise SystemExit(ExitCode.USAGE)
    for warning in warnings:
        click.echo(f"{loaded.path}: warning: {warning}", err=True)
    for note in notes:
        click.echo(f"{loaded.path}: note: {note}", err=True)
    if consul_servers:
        click.echo(f"{loaded.path}: Consul servers: {srv.summary(consul_servers)}")
    click.echo(f"{loaded.path}: OK ({plural(len(loaded.selected), 'host')})")
