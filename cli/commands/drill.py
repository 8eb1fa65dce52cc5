"""``clusterctl drill``: a fault drill from the library (operate/drills/) or a file, against one unit or node of
an inventory, with the edge's traffic measured throughout.

Glue: the drill file (:mod:`operate.drill_scenario`), the inventory and its ``drills_allowed``, the target,
the transport preflight uses (:class:`preflight.transport.RoutingTransport`) -> :mod:`operate.drill` -> the
table, and with ``--out`` the report (:mod:`operate.report`). Exit codes: 0 every check met, 1 a check not met
or a fault that could not be injected, 2 bad input (a drill file, an inventory that does not allow drills, an
unreachable edge: nothing touched), 130 Ctrl-C (everything the drill changed is restored first).
"""

from __future__ import annotations

import click

from cli import app, consul_target
from cli.endpoint import announce, endpoint_option, resolve_endpoint
from cli.help import examples
from cli.options import vault_password_file_option
from common.errors import ExitCode, UsageError

_EXAMPLES = examples(
    "clusterctl drill --list",
    "clusterctl drill engine-crash -i inventory/virtual --target r01n01-iu0",
    "clusterctl drill engine-crash -i inventory/virtual --endpoint 127.0.1.11:8080 --target r01n01-iu0",
    "clusterctl drill my-drill.yml -i inventory/prod --endpoint edge1:8080 --out reports/drill --rate 20",
    note="The edge must answer with X-Eas-IU (its debug_headers: true) for the routing measures. Hosts need "
         "'drills_allowed: true' in the inventory. Exit codes: 0 every check met, 1 a check not met, 2 bad "
         "input (nothing touched), 130 interrupted (the faults are undone first). docs/drills.md.",
)


def _list() -> None:
    from operate.drill import library_table
    from operate.drill_scenario import library, load_drill

    app.current().console.print(library_table([load_drill(str(p)) for p in library()]))


@click.command("drill", epilog=_EXAMPLES)
@click.argument("scenario", required=False)
@click.option("--list", "list_only", is_flag=True, help="Show the drill library and exit.")
@click.option("-i", "--inventory", "inventory", default=None, type=click.Path(path_type=str),
              help="Ansible inventory (file or directory) holding the target.")
@endpoint_option
@click.option("--target", default=None, help="IU id (or node name) to fault (default: the first IU).")
@click.option("--consul", "consul_addr", default=None,
              help="Consul HOST:PORT whose health of the target is sampled (default: the target's "
                   "consul_http_addr, else CONSUL_HTTP_ADDR; without any, Consul is not watched).")
@click.option("--rate", default=None, type=click.FloatRange(0, None, min_open=True),
              help="Requests per second instead of the drill file's (about 60% of the cluster's goodput).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Write the report here: JSON, Markdown and the PNG timeline.")
@click.option("--override-drills-allowed", "override", is_flag=True,
              help="Drill a host whose inventory does not set drills_allowed: true (it serves traffic).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of the table.")
@vault_password_file_option
def command(scenario, list_only, inventory, endpoint, target, consul_addr, rate, out_dir, override, as_json,
            vault_password_file) -> None:
    """Run a fault drill: load through the edge, a fault on one unit or node, recovery, measured and judged."""
    if list_only:
        _list()
        return
    if not scenario or not inventory:
        missing = [n for n, v in (("SCENARIO", scenario), ("-i/--inventory", inventory)) if not v]
        raise UsageError(f"drill: missing {', '.join(missing)} (or --list for the library)")
    from cli.commands.loadtest import emit
    from cluster.ansible import vault
    from cluster.ansible.inventory import cluster_of, load_inventory
    from operate import drill as drills
    from operate.drill_scenario import load_drill
    from preflight.transport import RoutingTransport

    plan = load_drill(scenario)
    secrets = vault.secrets_for(vault_password_file)
    loaded = load_inventory(inventory, vault_secrets=secrets)
    become = {name: drills.becomes(hostvars) for name, hostvars in loaded.selected.items()}
    chosen = drills.pick_target(cluster_of(loaded), plan, target, become)
    why = drills.refusal(loaded.selected.get(chosen.node.name, {}), chosen.node, inventory)
    if why and not override:
        raise UsageError(why)
    endpoint, origin = resolve_endpoint(endpoint, loaded=loaded)
    current = app.current()
    announce(endpoint, origin)
    consul = consul_target.resolve_consul(consul_addr, loaded, node=chosen.node, optional=True)
    consul_target.announce(consul)
    io = None if consul is None else consul.io(timeout_s=2.0)
    transport = RoutingTransport()
    ladder = None
    if plan.recovery == "remediate" and io is not None:
        from consul_io.layout import DEFAULT_DATACENTER
        from operate.remediate import Remediation
        from operate.remediate_reboot import PlaybookReboot
        from operate.xid_catalog import load_catalog

        catalog = load_catalog()  # a broken catalogue is exit 2 before the load starts

        def log_ladder(line: str) -> None:
            current.err_console.print(f"  remediate {line.strip()}", highlight=False)

        def ladder():
            # no rung named: the XID catalogue's for the unit's latest XID, as clusterctl remediate without --from
            return Remediation(cluster_of(loaded), chosen, transport, io,
                               chosen.node.settings.consul.dc or DEFAULT_DATACENTER, reason=f"drill {plan.name}",
                               log=log_ladder, catalog=catalog,
                               reboot=PlaybookReboot(inventory, secrets, vault_password_file, log=log_ladder)).run()
    try:
        result = drills.run(plan, chosen, transport, endpoint, consul_io=io, rate=rate, remediate=ladder,
                            log=lambda line: current.err_console.print(line, highlight=False))
    finally:
        transport.close()
    emit(result, out_dir, as_json)
    if result.interrupted:
        raise SystemExit(ExitCode.INTERRUPTED)
    if not result.passed:
        raise SystemExit(ExitCode.FAILED)

