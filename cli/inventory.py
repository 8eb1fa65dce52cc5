"""``clusterctl inventory show|validate``."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.tree import Tree

from cli.options import inventory_option, limit_option, vault_password_file_option
from cluster import inventory as inv
from cluster import validate as val
from cluster import vault
from cluster.model import Cluster


@click.group("inventory")
def command() -> None:
    """Show and validate the cluster model built from an Ansible inventory."""


@command.command("show")
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
    Console().print(cluster_tree(cluster, inventory))


def cluster_tree(cluster: Cluster, title: str) -> Tree:
    nodes = list(cluster.nodes())
    tree = Tree(
        f"[bold]{title}[/]: {len(cluster.racks)} racks, {len(nodes)} nodes, "
        f"{sum(len(n.ius) for n in nodes)} IUs, {sum(n.gpu_count for n in nodes)} GPUs"
    )
    for rack in cluster.racks:
        rack_branch = tree.add(f"[bold cyan]rack {rack.name}[/]")
        for node in rack.nodes:
            node_branch = rack_branch.add(
                f"[bold]{node.name}[/] {node.address}  {node.gpu_model} x{node.gpu_count}  "
                f"NICs: {', '.join(n.device for n in node.nics) or '-'}"
            )
            for iu in node.ius:
                node_branch.add(
                    f"[green]{iu.id}[/]  GPUs {iu.cuda_visible_devices}  NUMA {iu.numa_node}  "
                    f"port {iu.port}  NICs {', '.join(iu.nics) or '-'}"
                )
    return tree


@command.command("validate")
@inventory_option
@limit_option
@vault_password_file_option
def validate(inventory: str, limit: str | None, vault_password_file: Path | None) -> None:
    """Report every inventory problem at once (exit 2 if any)."""
    loaded = inv.load_inventory(inventory, limit, vault.secrets_for(vault_password_file))
    problems = val.validate(loaded.selected, loaded.everyone)
    if problems:
        for problem in problems:
            click.echo(f"{loaded.path}: {problem}", err=True)
        click.echo(f"{len(problems)} problem(s) in {loaded.path}", err=True)
        raise SystemExit(2)
    for warning in val.security_warnings(loaded.selected):
        click.echo(f"{loaded.path}: warning: {warning}", err=True)
    click.echo(f"{loaded.path}: OK ({len(loaded.selected)} hosts)")
