"""``clusterctl virtual create|up|down|status``: simulated machines for the virtual inventory.

The simulators live in the top-level ``sim`` package, which production modules never import
(tests/test_import_lint.py); this command imports it inside each command function, only when run.

Every subcommand takes the inventory as ``-i DIR`` like the rest of the CLI; the older positional
``DIR`` still works and prints a deprecation note (after the command's work, so an error stays one line).

``virtual up`` on machines that are running and were provisioned since they came up refuses (exit 2)
unless ``--reset``: bringing them up again discards everything provisioning put on them. Each machine
carries that fact itself, a stamp provisioning leaves on every host (:mod:`sim.hosts.run_state`).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import click

from cli.help import SuggestingGroup, examples
from cli.options import vault_password_file_option
from cluster.ansible import vault
from cluster.model import GPU_MODELS
from common.errors import ClusterctlError, ExitCode, UsageError
from common.text import plural

# The choices `virtual create --fabric` offers (sim.hosts.create.FABRICS; a test keeps them equal).
FABRICS = ("ib", "roce", "mixed")


def _inventory_arg(func):
    """``-i/--inventory DIR`` plus the deprecated positional ``DIR``; the command gets both."""
    func = click.argument("positional", required=False, metavar="[DIR]", type=click.Path(path_type=str))(func)
    return click.option("-i", "--inventory", "inventory", default=None, type=click.Path(path_type=str),
                        help="The virtual inventory directory (the positional DIR is deprecated).")(func)


def _resolve_inventory(inventory: str | None, positional: str | None, must_exist: bool = True) -> str:
    if inventory and positional and inventory != positional:
        raise UsageError(f"two inventories given: -i {inventory} and {positional}")
    chosen = inventory or positional
    if not chosen:
        raise UsageError("missing -i/--inventory DIR (e.g. clusterctl virtual up -i mycluster)")
    if must_exist and not Path(chosen).exists():
        raise UsageError(f"{chosen}: inventory not found (create one with clusterctl virtual create -i {chosen})")
    return chosen


def _deprecated_form(inventory: str | None, positional: str | None) -> None:
    """Printed after the command did its work, so an error stays the one line it is."""
    if positional and not inventory:
        click.echo(f"note: the positional inventory is deprecated; use -i {positional}", err=True)


def _running(status) -> bool:
    return status.state != "stopped"


@click.group("virtual", cls=SuggestingGroup, epilog=examples(
    "clusterctl virtual create -i mycluster --nodes 4 --racks 2",
    "clusterctl virtual up -i mycluster",
    "clusterctl virtual status -i mycluster",
    "clusterctl virtual down -i mycluster",
))
def command() -> None:
    """Create, start and stop simulated hosts (the virtual inventory)."""


@command.command("create", epilog=examples(
    "clusterctl virtual create -i mycluster --nodes 4 --racks 2",
    "clusterctl virtual create -i big --nodes 64 --racks 8 --gpu h200-sxm --fabric mixed --faults none",
))
@_inventory_arg
@click.option("--nodes", type=click.IntRange(min=1), default=4, show_default=True, help="Number of nodes.")
@click.option("--racks", type=click.IntRange(min=1), default=2, show_default=True,
              help="Number of racks (nodes spread in order).")
@click.option("--gpu", "gpu_model", type=click.Choice(GPU_MODELS), default="h100-sxm", show_default=True,
              help="GPU model of every node.")
@click.option("--fabric", type=click.Choice(FABRICS), default="ib", show_default=True,
              help="ib: InfiniBand; roce: RoCE everywhere; mixed: the last rack RoCE.")
@click.option("--faults", type=click.Choice(["default", "none"]), default="default", show_default=True,
              help="default: a few nodes with hardware faults that preflight must catch.")
@click.option("--force", is_flag=True, help="Replace an inventory already in DIR.")
def create(inventory: str | None, positional: str | None, nodes: int, racks: int, gpu_model: str, fabric: str,
           faults: str, force: bool) -> None:
    """Write a virtual inventory (hosts.yml, group_vars, host_vars) into DIR."""
    from sim.hosts import create as create_inventory

    directory = Path(_resolve_inventory(inventory, positional, must_exist=False))
    try:
        written = create_inventory.write(directory, nodes, racks, gpu_model, fabric, faults, force)
    except (ValueError, FileExistsError) as exc:
        raise ClusterctlError(str(exc), exit_code=ExitCode.USAGE) from None
    faulty = sorted(p.stem for p in written if p.parent.name == "host_vars")
    click.echo(f"{directory}: {plural(nodes, 'node')} in {plural(racks, 'rack')} ({gpu_model}, {fabric}); "
               + (f"injected faults on {', '.join(faulty)}" if faulty else "no injected faults"))
    click.echo(f"next: clusterctl virtual up -i {directory}")
    _deprecated_form(inventory, positional)


@command.command("up", epilog=examples(
    "clusterctl virtual up -i mycluster",
    "clusterctl virtual up -i mycluster --reset      # again, discarding what was provisioned",
))
@_inventory_arg
@click.option("--limit", "-l", default=None, help="Ansible host pattern: bring up only these hosts.")
@click.option("--reset", is_flag=True,
              help="Bring up machines that are running and provisioned, discarding their state.")
@vault_password_file_option
def up(inventory: str | None, positional: str | None, limit: str | None, reset: bool,
       vault_password_file: Path | None) -> None:
    """Boot one machine per host of the inventory, and serve the machines' package sources on 127.0.255.1:8080:
    the stand-in NVIDIA/HashiCorp apt repositories and the local package index that the inventory's
    repository URLs name (sim/hosts/repos.py; the last `virtual down` stops the server). Machines already
    up are replaced, fresh; if they were provisioned since they came up it refuses (that would discard
    what provisioning did) unless --reset. Builds the machine image first when it is not cached, printing
    its progress."""
    from sim.hosts import lifecycle, run_state

    given, inventory = inventory, _resolve_inventory(inventory, positional)
    provisioned = run_state.provisioned(lifecycle.layout(inventory))
    if provisioned and not reset:
        running = [h.name for h in lifecycle.status(inventory) if _running(h) and h.name in provisioned]
        if running:
            when = datetime.fromtimestamp(max(provisioned[name] for name in running)).strftime("%H:%M:%S")
            raise UsageError(
                f"{inventory}: {plural(len(running), 'machine')} up and provisioned at {when}; bringing "
                f"them up again discards that state (add --reset to do it, then rerun clusterctl provision)"
            )
    result = lifecycle.up(inventory, limit, vault.secrets_for(vault_password_file))
    note = f" ({len(result.unreachable)} unreachable: {', '.join(result.unreachable)})" if result.unreachable else ""
    click.echo(f"{inventory}: {plural(len(result.hosts), 'machine')} up in {result.seconds:.2f}s{note}")
    click.echo(f"next: clusterctl provision -i {inventory}")
    _deprecated_form(given, positional)


@command.command("down", epilog=examples("clusterctl virtual down -i mycluster"))
@_inventory_arg
def down(inventory: str | None, positional: str | None) -> None:
    """Stop the inventory's machines and remove their overlays (also after a killed `up`)."""
    from sim.hosts import lifecycle

    given, inventory = inventory, _resolve_inventory(inventory, positional)
    start = time.monotonic()
    if not lifecycle.state_dir(inventory).exists():  # idempotent, but say why nothing happened
        click.echo(f"{inventory}: no simulated machines here (nothing was brought up with "
                   f"`clusterctl virtual up -i {inventory}`); nothing to stop")
        _deprecated_form(given, positional)
        return
    stopped = lifecycle.down(inventory)
    click.echo(f"{inventory}: {plural(stopped, 'machine')} stopped in {time.monotonic() - start:.2f}s")
    _deprecated_form(given, positional)


@command.command("status", epilog=examples("clusterctl virtual status -i mycluster"))
@_inventory_arg
def status(inventory: str | None, positional: str | None) -> None:
    """Each machine of the inventory: its state (systemd's, inside it), address, injected faults, and when it
    was provisioned since it came up."""
    from sim.hosts import lifecycle, run_state

    given, inventory = inventory, _resolve_inventory(inventory, positional)
    hosts = lifecycle.status(inventory)
    provisioned = run_state.provisioned(lifecycle.layout(inventory))
    _deprecated_form(given, positional)
    if not hosts:
        click.echo(f"{inventory}: no machines")
        return
    for host in hosts:
        faults = ", ".join(
            f["kind"] + "(" + ", ".join(f"{k}={v}" for k, v in f.items() if k != "kind") + ")" for f in host.faults
        )
        stamp = provisioned.get(host.name)
        when = f"  provisioned {datetime.fromtimestamp(stamp):%H:%M:%S}" if stamp is not None else ""
        click.echo(f"{host.name:<12} {host.address:<15} {host.state:<12} {faults or 'healthy'}{when}")
