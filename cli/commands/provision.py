"""``clusterctl provision``: run the provisioning playbook in stop-on-failure batches.

    clusterctl provision -i INV [--limit PATTERN] [--tags T] [--check --diff] [--batches 1,10%,100%]
                         [--forks N] [--plan] [--playbook site.yml] [--run-dir DIR]
                         [--vault-password-file FILE] [--yes]

Glue over :mod:`provision`: the plan validates the inventory first (exit 2, no host contacted)
(:mod:`provision.plan`); the playbook runs through ansible-runner in this process and every event is
appended to ``<run dir>/events.jsonl`` (default ``.state/runs/<UTC timestamp>/``) (:mod:`provision.run`);
this module draws the live view of the batch and each host's current task and counts from the
:class:`~provision.rollout.Rollout`, and the recap table. Exit 0 only when no host failed or was
unreachable and every planned host ran.

Without ``--limit`` a run changes every host of the inventory: on a terminal it asks first, naming the
playbook, the hosts and the batches; ``--yes`` (scripts, CI) runs without asking; with neither a terminal nor
``--yes`` it stops with exit 2 before any host is contacted. ``--plan`` and ``--check`` change nothing and
never ask.

Output: on a terminal a live view (each host's state as it changes, batch and run time); anywhere else
(CI logs, ``| tee``, ``> log``), or with ``--plain``, one line per event instead: a batch started or
finished, a host failed, was unreachable or is done. ``--diff`` prints each changed file's diff per
host after the recap (lines naming a password/token/secret/key show ``********``; a ``no_log`` task
sends no diff at all and is listed as ``diff hidden: no_log``, any other change without a diff as ``no
diff reported``; a mode/owner change shows the attribute). ``--check`` ends with what would change,
never "rollout complete".

``--vault-password-file`` is checked first (exists; a plain file must be 0600, an executable one is a
vault password script), then decrypts vault content while the inventory loads and goes to
ansible-playbook as its own ``--vault-password-file``: only the path travels, never the password.
Without it, both use what Ansible's configuration names (ANSIBLE_VAULT_PASSWORD_FILE...).
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from pathlib import Path

import click
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from cli import app
from cli.help import examples
from cli.options import inventory_option, limit_option, vault_password_file_option
from cluster import servers
from cluster.ansible import vault
from cluster.ansible.inventory import InventoryError
from common.errors import ExitCode, UsageError
from common.text import plural
from provision import run
from provision.plan import (
    DEFAULT_BATCHES,
    PLAYBOOK_DIR,
    SPECIAL_TAGS,
    Plan,
    known_tags,
    make_plan,
    parse_batches,
)
from provision.rollout import Rollout

STATUS_STYLE = {
    "waiting": "dim", "not started": "dim", "running": "cyan", "ok": "green", "failed": "bold red",
    "unreachable": "bold red", "stopped": "yellow",
}
MAX_DIFFS = 200  # diffs printed; all of them are in events.jsonl


def _site_tags() -> str:
    try:
        return ", ".join(t for t in known_tags(PLAYBOOK_DIR / "site.yml") if t not in SPECIAL_TAGS)
    except (OSError, ValueError):  # a broken checkout: the help still renders
        return "see playbooks/site.yml"


@click.command("provision", epilog=examples(
    "clusterctl provision -i inventory/prod --limit rack_r12 --plan",
    "clusterctl provision -i inventory/prod --limit rack_r12",
    "clusterctl provision -i inventory/prod --yes",
    "clusterctl provision -i inventory/prod --tags chrony --limit r01n01 --check --diff",
    "clusterctl provision -i inventory/prod --playbook rolling-restart.yml --limit r12n03",
    note="Without --limit a terminal asks first (naming the hosts and batches); scripts pass --yes. "
         "Exit codes: 0 every planned host provisioned, 1 a host failed or was unreachable (the rollout "
         "stops at that batch), 2 usage or inventory error (no host contacted).",
))
@inventory_option
@limit_option
@click.option("--tags", "-t", "tags", default=None, metavar="TAGS",
              help=f"Comma-separated tags of site.yml: {_site_tags()}.")
@click.option("--check", is_flag=True, help="Dry run: report what would change, change nothing.")
@click.option("--diff", is_flag=True, help="Print each changed file's diff per host (secrets masked).")
@click.option("--batches", default=None, help="Batch sizes, e.g. 1,10%,100% (default 1,10%,50%,100%).")
@click.option("--forks", type=click.IntRange(1, 512), default=None,
              help="Parallel hosts per batch (default: ansible.cfg's forks).")
@click.option("--plain", is_flag=True,
              help="One line per event instead of the live view (the default when stdout is not a terminal).")
@click.option("--plan", "plan_only", is_flag=True, help="Print roles, hosts and batches; touch nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --plan: print the plan as JSON.")
@click.option("--allow-reboot", is_flag=True,
              help="Reboot hosts that need it (driver change, kernel arguments, firmware) and continue; "
                   "without it they are listed as reboot pending.")
@click.option("--playbook", default="site.yml", show_default=True, help="Playbook in playbooks/ (or a path).")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None,
              help="Where events.jsonl and runner artifacts go (default .state/runs/<timestamp>).")
@click.option("--yes", "-y", "yes", is_flag=True,
              help="Run on the whole inventory without asking (scripts, CI); without --limit a terminal asks "
                   "first, and anything else is refused (exit 2).")
@vault_password_file_option
def command(
    inventory: str, limit: str | None, tags: str | None, check: bool, diff: bool, batches: str | None,
    forks: int | None, plain: bool, plan_only: bool, as_json: bool, allow_reboot: bool, playbook: str,
    run_dir: Path | None, yes: bool, vault_password_file: Path | None,
) -> None:
    """Provision nodes with the Ansible roles, batch by batch; a failed batch stops the rollout."""
    if as_json and not plan_only:
        raise click.UsageError("--json prints the plan: use it with --plan (a run's events are in its "
                               "run dir's events.jsonl)")
    vault_secrets = vault.secrets_for(vault_password_file)  # the file was checked by the option
    tag_list = [t.strip() for t in tags.split(",") if t.strip()] if tags else []
    sizes = parse_batches(batches) if batches else list(DEFAULT_BATCHES)
    plan = make_plan(inventory, playbook, limit, tag_list, sizes, vault_secrets=vault_secrets)
    console = app.current().console
    if plan_only:
        if as_json:
            click.echo(json.dumps(plan.to_json(), indent=2))
        else:
            console.print(plan_view(plan))
        return
    run_dir = run_dir or Path(".state") / "runs" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    if problem := run.run_dir_problem(run_dir, plan.inventory):
        raise InventoryError(problem)
    if limit is None and not check and not yes:
        confirm_whole_inventory(plan)
    live = not plain and console.is_terminal
    rollout, rc = run_playbook(
        plan, run_dir, console, check=check, diff=diff, forks=forks, vault_password_file=vault_password_file,
        live=live, allow_reboot=allow_reboot,
    )
    console.print(recap_table(rollout))
    if rollout.batch_seconds:
        console.print(Text("batch times: " + ", ".join(
            f"{i + 1}: {s:.1f}s" for i, s in enumerate(rollout.batch_seconds)) + f"; run {rollout.elapsed():.1f}s"))
    for message in rollout.messages[:20]:
        console.print(Text(message, style="red"))
    if diff:
        print_diffs(console, rollout, check)
    console.print(Text(rollout.summary(check)))
    for line in (rollout.reboot_line(), rollout.restart_line()):
        if line:
            console.print(Text(line), soft_wrap=True)
    console.print(Text(f"events: {run_dir / 'events.jsonl'}"), soft_wrap=True)
    if not rollout.succeeded(rc):
        raise SystemExit(ExitCode.FAILED)


def confirm_whole_inventory(plan: Plan) -> None:
    """No --limit changes every host of the inventory: a person at a terminal says yes first (a typo'd or
    forgotten --limit on prod is the costliest mistake this command allows); a script says --yes. Anything
    else stops here, before a host is contacted."""
    what = (f"{plan.playbook.name} on all {plural(len(plan.hosts), 'host')} of {plan.inventory} in "
            f"{plural(len(plan.batches), 'batch', 'batches')}")
    if not app.stdin_is_terminal():
        raise UsageError(f"no --limit: this would run {what}, and there is no terminal to confirm it; pass --yes "
                         "to run it on every host, or --limit PATTERN for fewer (--plan shows the batches)")
    if not click.confirm(f"no --limit: run {what}?", default=False, err=True):
        raise UsageError("not confirmed: no host was contacted")


def print_diffs(console: Console, rollout: Rollout, check: bool) -> None:
    """Each host's file diffs, like ``ansible-playbook --diff`` prints them, after the recap."""
    verb = "would change" if check else "changed"
    if not rollout.diffs:
        changes = sum(rollout.changes().values())
        console.print(Text(f"diff: no file {verb}" if not changes else (
            f"diff: {plural(changes, 'change')} {'would be' if check else 'was' if changes == 1 else 'were'} made, "
            "none of them reported a diff (events.jsonl has each task's result)")))
        return
    for d in rollout.diffs[:MAX_DIFFS]:
        console.print(Text(f"== {d.host}: {d.task} ({verb}{f'; {d.hidden}' if d.hidden else ''})", style="bold"),
                      soft_wrap=True)
        for line in d.text.splitlines():
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
            console.print(Text(line, style=style), soft_wrap=True, highlight=False)
    if len(rollout.diffs) > MAX_DIFFS:
        console.print(Text(f"(+{len(rollout.diffs) - MAX_DIFFS} more diffs in events.jsonl)"))


def run_playbook(
    plan: Plan, run_dir: Path, console: Console, *, check: bool, diff: bool, forks: int | None,
    vault_password_file: Path | None = None, live: bool = True, allow_reboot: bool = False,
) -> tuple[Rollout, int]:
    """:func:`provision.run.run_playbook` drawn on ``console``: a live view, or one line per notice."""
    with Live(
        live_view(Rollout(plan)), console=console, refresh_per_second=4, transient=True
    ) if live else contextlib.nullcontext() as view:

        def on_event(rollout: Rollout) -> None:
            if view is not None:
                view.update(live_view(rollout))
            else:  # plain: the lines the state changes produced, as they happen
                for notice in rollout.notices:
                    console.print(Text(notice), soft_wrap=True)

        result = run.run_playbook(
            plan, run_dir, check=check, diff=diff, forks=forks, vault_password_file=vault_password_file,
            allow_reboot=allow_reboot, on_event=on_event,
        )
    if result.events_error:
        console.print(Text(f"warning: {result.events_error}"), style="yellow")
    return result.rollout, result.rc


def live_view(rollout: Rollout) -> LiveView:
    return LiveView(rollout)


class LiveView:
    """The batch, each host's status, current task and counts, sized when drawn (a terminal can be resized):
    host, batch, status and the counts keep their full width, header included; the task gets the columns
    left and only it is cut, with an ellipsis (role task names run to ~100 characters)."""

    COLUMNS = ("host", "batch", "status", "task", "ok", "changed", "failed")
    RIGHT = ("batch", "ok", "changed", "failed")
    GAP = 2  # between two columns: the table's padding of 1 on each side, no outer edge

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        rollout = self.rollout
        yield Text.assemble(
            (rollout.plan.playbook.name, "bold"),
            f": batch {max(rollout.batches_started, 1)}/{len(rollout.plan.batches)} "
            f"({rollout.batch_elapsed():.0f}s), run {rollout.elapsed():.0f}s",
        )
        shown = [p for p in rollout.hosts.values()
                 # hosts of later batches: keep the view short on large fleets
                 if not (p.status == "waiting" and (p.batch or 0) >= max(rollout.batches_started, 1) + 1)]
        cells = [{"host": p.name, "batch": _batch(p.batch), "status": p.status, "task": p.task,
                  "ok": str(p.ok), "changed": str(p.changed), "failed": str(p.failed)} for p in shown]
        widths = {c: max([cell_len(c), *(cell_len(row[c]) for row in cells)]) for c in self.COLUMNS}
        fixed = sum(w for c, w in widths.items() if c != "task") + self.GAP * (len(self.COLUMNS) - 1)
        widths["task"] = max(options.max_width - fixed, cell_len("task"))
        table = Table(box=None, pad_edge=False)
        for column in self.COLUMNS:
            table.add_column(column, justify="right" if column in self.RIGHT else "left", width=widths[column],
                             no_wrap=True, overflow="ellipsis" if column == "task" else "crop")
        for p, row in zip(shown, cells, strict=True):
            task = Text(row["task"])
            task.truncate(widths["task"], overflow="ellipsis")
            table.add_row(Text(row["host"]), row["batch"], Text(row["status"], style=STATUS_STYLE.get(p.status, "")),
                          task, row["ok"], row["changed"], row["failed"])
        yield table


def recap_table(rollout: Rollout) -> RecapTable:
    return RecapTable(rollout)


class RecapTable:
    """Each host's batch, final status and counts: a table where it fits, else one line per host, so that
    no header, host name, status or count is ever cut (CI logs are often 80 columns, host names long)."""

    COLUMNS = ("host", "batch", "status", "ok", "changed", "failed", "skipped", "unreachable")
    COUNTS = ("ok", "changed", "failures", "skipped", "dark")  # playbook_on_stats' keys, in COLUMNS' order

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    def rows(self) -> list[tuple[str, str, str, list[str]]]:
        stats = self.rollout.stats or {}
        return [(name, _batch(p.batch), p.label, [str((stats.get(key) or {}).get(name, 0)) for key in self.COUNTS])
                for name, p in self.rollout.hosts.items()]

    def table(self) -> Table:
        table = Table(title="provision recap")
        for column in self.COLUMNS:
            table.add_column(column, justify="left" if column in ("host", "status") else "right", no_wrap=True)
        for name, batch, label, counts in self.rows():
            table.add_row(Text(name), batch, Text(label, style=STATUS_STYLE.get(label, "")), *counts)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table()
        if Measurement.get(console, options.update_width(10_000), table).maximum <= options.max_width:
            yield table
            return
        yield Text("provision recap")
        for name, batch, label, counts in self.rows():
            yield Text.assemble(f"{name}  batch {batch}  ", (label, STATUS_STYLE.get(label, "")), "  ", " ".join(
                f"{column}={count}" for column, count in zip(self.COLUMNS[3:], counts, strict=True)))


def plan_view(plan: Plan) -> Group:
    header = Text.assemble(
        ("plan", "bold"),
        f": {plan.playbook.name} on {plural(len(plan.hosts), 'host')} of {plan.inventory}"
        f"{f' (limit {plan.limit})' if plan.limit else ''}",
    )
    if plan.consul_servers:
        header.append(f"\nConsul servers: {servers.summary(plan.consul_servers)}")
    plays = [Text(f"play {number}: {play.name}{_serial(play.name, play.sizes)}"
                  + ("" if play.batches else " (no host of this run)")
                  + "\n  roles: " + (" -> ".join(s.role for s in play.roles) or "none (the play's own tasks)"))
             for number, play in enumerate(plan.plays, 1)]
    table = Table(box=None)
    table.add_column("batch", justify="right")
    table.add_column("play", justify="right")
    table.add_column("hosts", justify="right")
    table.add_column("members")
    for index, batch in enumerate(plan.batches):
        members = ", ".join(batch) if len(batch) <= 12 else ", ".join(batch[:12]) + f", ... (+{len(batch) - 12})"
        play = plan.play_of(index)
        table.add_row(str(index + 1), str(plan.plays.index(play) + 1) if play else "-", str(len(batch)), Text(members))
    warnings = [Text.assemble(("warning:", "yellow"), " ", w) for w in plan.warnings]
    return Group(header, *plays, table, *warnings)


def _serial(name: str, sizes: tuple[int | str, ...]) -> str:
    """", how the play's hosts are batched", or "" where its name already says it ("Edges, one at a time")."""
    if sizes in (("100%",), ()):
        return ", all at once"
    if sizes == (1,):
        return "" if name.endswith("one at a time") else ", one host at a time"
    return ", batches " + ",".join(map(str, sizes))


def _batch(index: int | None) -> str:
    return "-" if index is None else str(index + 1)
