"""``clusterctl inventory show|validate``."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.text import Text
from rich.tree import Tree

from cli import app
from cli.help import examples
from cli.options import inventory_option, limit_option, vault_password_file_option
from cluster import validate as val
from cluster.ansible import inventory as inv
from cluster.ansible import vault
from cluster.model import Cluster
from common.errors import ExitCode
from common.text import plural


@click.group("inventory", epilog=examples("clusterctl inventory validate -i inventory/prod", "clusterctl inventory show -i inventory/prod --limit rack_r12"))
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


@command.command("validate", epilog=examples("clusterctl inventory validate -i inventory/prod", note="Exit codes: 0 no problem, 2 a problem (every one is listed, with the host and variable)."))
@inventory_option
@limit_option
@vault_password_file_option
def validate(inventory: str, limit: str | None, vault_password_file: Path | None) -> None:
    """Report every inventory problem at once (exit 2 if any)."""
    loaded = inv.load_inventory(inventory, limit, vault.secrets_for(vault_password_file))
    problems = val.validate(loaded.selected, loaded.everyone)
    if problems:
        lines = val.problem_lines(problems)
        for line in lines:
            click.echo(f"{loaded.path}: {line}", err=True)
        shown = f" ({len(lines)} distinct)" if len(lines) < len(problems) else ""
        click.echo(f"{plural(len(problems), 'problem')}{shown} in {loaded.path}", err=True)
        raise SystemExit(ExitCode.USAGE)
    for warning in val.security_warnings(loaded.selected):
        click.echo(f"{loaded.path}: warning: {warning}", err=True)
    click.echo(f"{loaded.path}: OK ({plural(len(loaded.selected), 'host')})")
