"""``clusterctl virtual create|up|down|status``: simulated machines for the virtual inventory.

The simulators live in the top-level ``sim`` package, which production modules never import
(tests/test_import_lint.py); this command imports it inside each command function, only when run.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from cli.errors import ClusterctlError
from cli.options import vault_password_file_option
from cluster import vault
from cluster.model import GPU_MODELS

# The choices `virtual create --fabric` offers (sim.hosts.create.FABRICS; a test keeps them equal).
FABRICS = ("ib", "roce", "mixed")


@click.group("virtual")
def command() -> None:
    """Create, start and stop simulated hosts (the virtual inventory)."""


@command.command("create")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--nodes", type=click.IntRange(min=1), required=True, help="Number of nodes.")
@click.option("--racks", type=click.IntRange(min=1), required=True, help="Number of racks (nodes spread in order).")
@click.option("--gpu", "gpu_model", type=click.Choice(GPU_MODELS), default="h100-sxm", show_default=True)
@click.option("--fabric", type=click.Choice(FABRICS), default="ib", show_default=True,
              help="ib: InfiniBand; roce: RoCE everywhere; mixed: the last rack RoCE.")
@click.option("--faults", type=click.Choice(["default", "none"]), default="default", show_default=True,
              help="default: a few nodes with hardware faults that preflight must catch.")
@click.option("--force", is_flag=True, help="Replace an inventory already in DIRECTORY.")
def create(directory: Path, nodes: int, racks: int, gpu_model: str, fabric: str, faults: str, force: bool) -> None:
    """Write a virtual inventory (hosts.yml, group_vars, host_vars) into DIRECTORY."""
    from sim.hosts import create as create_inventory

    try:
        written = create_inventory.write(directory, nodes, racks, gpu_model, fabric, faults, force)
    except (ValueError, FileExistsError) as exc:
        raise ClusterctlError(str(exc), exit_code=2) from None
    faulty = sum(1 for p in written if p.parent.name == "host_vars")
    click.echo(f"{directory}: {nodes} nodes in {racks} racks ({gpu_model}, {fabric}); {faulty} with injected faults")


@command.command("up")
@click.argument("inventory", type=click.Path(exists=True, path_type=str))
@click.option("--limit", "-l", default=None, help="Ansible host pattern: bring up only these hosts.")
@vault_password_file_option
def up(inventory: str, limit: str | None, vault_password_file: Path | None) -> None:
    """Boot one machine per host of the inventory (tears down any previous ones first; builds the machine
    image first when it is not cached, printing its progress)."""
    from sim.hosts import simulate

    result = simulate.up(inventory, limit, vault.secrets_for(vault_password_file))
    note = f" ({len(result.unreachable)} unreachable: {', '.join(result.unreachable)})" if result.unreachable else ""
    click.echo(f"{inventory}: {len(result.hosts)} machines up in {result.seconds:.2f}s{note}")


@command.command("down")
@click.argument("inventory", type=click.Path(exists=True, path_type=str))
def down(inventory: str) -> None:
    """Stop the inventory's machines and remove their overlays (also after a killed `up`)."""
    from sim.hosts import simulate

    start = time.monotonic()
    stopped = simulate.down(inventory)
    click.echo(f"{inventory}: {stopped} machines stopped in {time.monotonic() - start:.2f}s")


@command.command("status")
@click.argument("inventory", type=click.Path(exists=True, path_type=str))
def status(inventory: str) -> None:
    """Each machine of the inventory: its state (systemd's, inside it), address and injected faults."""
    from sim.hosts import simulate

    hosts = simulate.status(inventory)
    if not hosts:
        click.echo(f"{inventory}: no machines")
        return
    for host in hosts:
        faults = ", ".join(
            f["kind"] + "(" + ", ".join(f"{k}={v}" for k, v in f.items() if k != "kind") + ")" for f in host.faults
        )
        click.echo(f"{host.name:<12} {host.address:<15} {host.state:<12} {faults or 'healthy'}")
