"""``clusterctl remediate``: the action ladder (drain, restart, GPU reset, node reboot, mark the node for repair)
on one inference unit, behind the breaker, starting at the rung the XID catalogue names for the unit's latest
XID unless ``--from`` names one; a plan only unless ``--apply``.

Glue: the inventory, the target IU, the transport preflight uses (:class:`preflight.transport.RoutingTransport`)
and the node's Consul agent -> :mod:`operate.remediate` -> the steps and what the unit was left as. Exit codes:
0 planned (nothing touched) or the unit healthy and back in rotation, 1 the node marked for repair (now or
before), a step that could not be carried out, or the breaker open, 2 bad input (nothing touched), 3 Consul unreachable,
130 Ctrl-C (the unit stays drained: nothing is undone).
"""

from __future__ import annotations

import json
import os

import click

from cli import app, neterr
from cli.help import examples
from cli.options import vault_password_file_option
from common.errors import ClusterctlError, ExitCode, UsageError

_EXAMPLES = examples(
    "clusterctl remediate -i inventory/prod --target r12n03-iu1                 # the plan: nothing touched",
    "clusterctl remediate -i inventory/prod --target r12n03-iu1 --apply         # first rung from its latest XID",
    "clusterctl remediate -i inventory/prod --target r12n03-iu1 --apply --reason 'XID 13 storm'",
    "clusterctl remediate -i inventory/prod --target r12n03-iu0 --from gpu_reset --apply   # GPU at fault: reset first",
    note="Rungs: drain (Consul maintenance), restart, gpu_reset (nvidia-smi --gpu-reset of the unit's GPUs, or of the whole NVSwitch board when Fabric Manager is not running; a refused reset goes to the reboot), reboot "
         "(playbooks/node-reboot.yml on the node), repair (every unit of the node in maintenance and a record in "
         "Consul KV). Without --from the first rung is the XID catalogue's (operate/xid_catalog.yml) for the "
         "unit's xid_last in its score body, restart when there is none. A rung whose unit is not healthy "
         "within --verify-s leads to the next; a step that cannot be carried out stops with the unit drained. "
         "The breaker refuses when more than --max-unit-share of the units, or more than --max-nodes-per-rack "
         "nodes of the rack, would be out. docs/remediation.md.",
)


@click.command("remediate", epilog=_EXAMPLES)
@click.option("-i", "--inventory", "inventory", required=True, type=click.Path(path_type=str),
              help="Ansible inventory (file or directory) holding the unit.")
@click.option("--target", required=True, help="IU id of the unhealthy unit (e.g. r12n03-iu1).")
@click.option("--from", "start", default=None,
              type=click.Choice(["restart", "gpu_reset", "fabric_reset", "reboot", "repair"]),
              help="The first rung after the drain (default: the XID catalogue's for the unit's latest XID, else "
                   "restart).")
@click.option("--xid-max-age-s", default=3600.0, show_default=True, type=click.FloatRange(1, None),
              help="Without --from: an xid_last received longer ago than this no longer picks the first rung.")
@click.option("--reason", default="unhealthy", show_default=True,
              help="Why: goes into the maintenance reason and the repair record.")
@click.option("--apply", "apply", is_flag=True, help="Carry the ladder out (without it: the plan, nothing touched).")
@click.option("--consul", "consul_addr", default=None,
              help="Consul agent HOST:PORT the unit is registered on (default: the node's consul_http_addr).")
@click.option("--verify-s", default=300.0, show_default=True, type=click.FloatRange(1, 3600),
              help="Seconds a restarted or reset unit has to answer /health before the next rung.")
@click.option("--max-unit-share", default=0.10, show_default=True, type=float,
              help="Breaker: the largest share of the inventory's units out of rotation at once.")
@click.option("--max-nodes-per-rack", default=1, show_default=True, type=int,
              help="Breaker: the most nodes of one rack with a unit out of rotation at once.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON instead of the table.")
@vault_password_file_option
def command(inventory, target, start, xid_max_age_s, reason, apply, consul_addr, verify_s, max_unit_share, max_nodes_per_rack,
            as_json, vault_password_file) -> None:
    """Bring an unhealthy unit back (drain, restart, GPU reset) or take its node out for repair."""
    from cluster.ansible import vault
    from cluster.ansible.inventory import cluster_of, load_inventory
    from consul_io import layout
    from consul_io.client import ConsulIO, ConsulUnavailable, TokenError
    from operate import remediate
    from operate.drill import becomes
    from operate.remediate_breaker import Limits
    from operate.remediate_reboot import PlaybookReboot
    from operate.xid_catalog import load_catalog
    from preflight.transport import RoutingTransport

    limits = Limits(max_unit_share, max_nodes_per_rack)
    catalog = load_catalog()  # a broken catalogue is exit 2 before anything is contacted
    secrets = vault.secrets_for(vault_password_file)
    loaded = load_inventory(inventory, vault_secrets=secrets)
    become = {name: becomes(hostvars) for name, hostvars in loaded.selected.items()}
    cluster = cluster_of(loaded)
    chosen = remediate.find_target(cluster, target, become)
    settings = chosen.node.settings.consul
    try:
        token = settings.operator_token() or os.environ.get("CONSUL_HTTP_TOKEN") or None
    except TokenError as exc:
        raise UsageError(f"{inventory}: {chosen.node.name}: {exc}") from None
    addr = consul_addr or settings.address
    try:
        io = ConsulIO(addr, token=token, scheme=None if consul_addr else settings.scheme, dc=settings.dc,
                      timeout_s=5.0)
    except ConsulUnavailable as exc:
        raise UsageError(f"{'--consul' if consul_addr else f'{inventory}: {chosen.node.name}: consul_http_addr'}: "
                         f"{exc}") from None
    current = app.current()
    transport = RoutingTransport()

    def log(line: str) -> None:
        current.err_console.print(line, highlight=False)

    reboot = PlaybookReboot(inventory, secrets, vault_password_file, log=log)
    ladder = remediate.Remediation(cluster, chosen, transport, io, settings.dc or layout.DEFAULT_DATACENTER,
                                   limits, start, reason, verify_s, log=log, reboot=reboot, catalog=catalog,
                                   xid_max_age_s=xid_max_age_s)
    try:
        outcome = ladder.run() if apply else _planned(ladder)
    except ConsulUnavailable as exc:
        raise ClusterctlError(neterr.unreachable("Consul", io.address, exc, "pass --consul HOST:PORT"),
                              ExitCode.UNREACHABLE) from None
    finally:
        transport.close()
    if as_json:
        click.echo(json.dumps(outcome.as_dict(), indent=2))
    else:
        current.console.print(_table(outcome))
    if outcome.state == "interrupted":
        raise SystemExit(ExitCode.INTERRUPTED)
    if not outcome.ok:
        raise SystemExit(ExitCode.FAILED)


def _planned(ladder):
    """The plan and the breaker's verdict now; nothing is changed."""
    from consul_io import layout
    from operate.remediate import Outcome
    from operate.remediate_breaker import judge

    plan = ladder.plan()
    _, entries = ladder.io.health_service()
    verdict = judge(ladder.cluster, entries, ladder.target.node.name, (ladder.iu.id,), ladder.limits)
    key = layout.repair_key(ladder.datacenter, ladder.target.node.name)
    marked = ladder.io.kv_read(key)[1] is not None
    return Outcome(ladder.iu.id, "planned", "plan only: pass --apply to carry it out" +
                   (f" (it would be refused now: the node is marked for repair, {key})" if marked
                    else f" (it would stop now: {verdict.reason})" if verdict.open else ""),
                   verdicts=[verdict], left=[f"{ladder.iu.id}: untouched"], plan=plan, start=ladder.start,
                   start_why=ladder.start_why)


def _table(outcome):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts = []
    if outcome.state == "planned":
        plan = Table(title=f"remediate {outcome.target}: the plan", title_justify="left")
        plan.add_column("#", justify="right")
        plan.add_column("step")
        for i, line in enumerate(outcome.plan, 1):
            plan.add_row(str(i), line)
        parts.append(plan)
    else:
        steps = Table(title=f"remediate {outcome.target}", title_justify="left")
        for name in ("at", "rung", "took", "result", "what"):
            steps.add_column(name, justify="right" if name in ("at", "took") else "left")
        for s in outcome.steps:
            steps.add_row(f"{s.at_s:.1f} s", s.rung, f"{s.took_s:.1f} s",
                          Text("ok", style="green") if s.ok else Text("FAILED", style="red"),
                          "; ".join(s.did + ([s.detail] if s.detail else [])))
        parts.append(steps)
    if outcome.start_why and outcome.state != "planned":  # the plan lists it as its second step
        parts.append(Text(f"first rung: {outcome.start_why}"))
    for verdict in outcome.verdicts:
        parts.append(Text(verdict.reason))
    parts += [Text(f"left: {line}") for line in outcome.left]
    parts.append(Text(f"{outcome.state}: {outcome.message}" + (f" ({outcome.took_s:.1f} s)" if outcome.took_s else "")))
    return Group(*parts)
