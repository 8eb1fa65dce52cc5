"""``clusterctl demo``: the options; the scenario itself is :mod:`demo.scenario`."""

from __future__ import annotations

import click

from cli.help import examples


@click.command("demo", epilog=examples("clusterctl demo", "clusterctl demo --nodes 6 --racks 3 --duration 30 --keep"))
@click.option("--nodes", type=click.IntRange(2, 16), default=4, show_default=True, help="Simulated nodes.")
@click.option("--racks", type=click.IntRange(1, 8), default=2, show_default=True, help="Racks (nodes spread in order).")
@click.option("--duration", type=click.FloatRange(5, 3600), default=60, show_default=True,
              help="Seconds of routed traffic.")
@click.option("--rate", type=click.FloatRange(0.1, 200), default=None,
              help="Requests/s of the production mix (default: 0.8 per released IU).")
@click.option("--keep", is_flag=True, help="Keep the temp dir (inventory, logs, preflight JSON).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the request mix.")
def command(nodes: int, racks: int, duration: float, rate: float | None, keep: bool, seed: int) -> None:
    """Run the whole toolkit end to end on a temporary virtual cluster, offline (every node provisioned for
    real: about 7-9 minutes for 4 nodes on 2 cores)."""
    if racks > nodes:
        raise click.BadParameter("cannot have more racks than nodes", param_hint="--racks")
    # The demo sits above the CLI and drives the simulators: imported only when it runs
    # (tests/test_import_lint.py: the CLI's lazy commands are the one import upward).
    from cli.app import current
    from demo import scenario

    scenario.run(current().console, nodes, racks, duration, rate, keep, seed)
