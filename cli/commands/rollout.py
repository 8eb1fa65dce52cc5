"""``clusterctl rollout start|status|pause|resume|abort``: shift traffic to a new revision in gated steps.

Glue: options -> :mod:`operate.rollout_plan` (the file), :mod:`operate.rollout_run` (the state machine, the
controller, the Consul document) -> :mod:`operate.rollout_report` (the table, the report files). The state is
the document in Consul, so ``status``, ``pause``, ``resume`` and ``abort`` work from any controller, and ``start``
with the same file takes up a rollout a stopped controller left; a paused rollout keeps ``start`` waiting (still
judging: a failure still aborts) until an operator resumes or aborts it. Exit codes: 0 promoted (or, for the other
commands, done), 1 aborted by its gates or an operator, 2 bad input (nothing written to Consul), 3 Consul
unreachable.
"""

from __future__ import annotations

import os
import time

import click

from cli import app, neterr
from cli.help import SuggestingGroup, examples
from common.errors import ClusterctlError, ExitCode
from consul_io import layout
from consul_io.client import ConsulIO, ConsulUnavailable, TokenError, read_token_file

_EXAMPLES = examples(
    "clusterctl rollout start operate/rollouts/phased-5-20-50-100.yml --consul 127.0.0.1:8500",
    "clusterctl rollout status",
    "clusterctl rollout pause --reason 'ECC errors on r12'",
    "clusterctl rollout abort --reason 'p99 regression seen by clients'",
    note="Rollout files: operate/rollouts/ (phased-5-20-50-100.yml: 5/20/50/100% with 48 h holds; ci-short.yml: seconds). "
         "Exit codes: 0 promoted or done, 1 aborted, 2 bad input (nothing written), 3 Consul unreachable.",
)


def _consul_options(f):
    f = click.option("--consul", "consul_addr", default=None, metavar="HOST:PORT",
                     help="Consul HTTP address (else CONSUL_HTTP_ADDR, else 127.0.0.1:8500).")(f)
    f = click.option("--dc", "datacenter", default=layout.DEFAULT_DATACENTER, show_default=True,
                     help="Datacenter of the rollout document.")(f)
    return click.option("--token-file", default=None, type=click.Path(dir_okay=False),
                        help="File (mode 0600) holding the operator's Consul token (else CONSUL_HTTP_TOKEN).")(f)


def _io(consul_addr: str | None, token_file: str | None) -> ConsulIO:
    addr = consul_addr or os.environ.get("CONSUL_HTTP_ADDR") or layout.DEFAULT_HTTP_ADDR
    try:
        token = read_token_file(token_file) if token_file else os.environ.get("CONSUL_HTTP_TOKEN") or None
    except TokenError as exc:
        raise ClusterctlError(f"--token-file: {exc}", ExitCode.USAGE) from None
    try:
        return ConsulIO(addr, token=token, timeout_s=3.0)
    except ConsulUnavailable as exc:
        raise ClusterctlError(f"--consul: {exc}", ExitCode.USAGE) from None


def _unreachable(io: ConsulIO, exc: ConsulUnavailable) -> ClusterctlError:
    return ClusterctlError(neterr.unreachable("Consul", io.address, exc, "pass --consul HOST:PORT"),
                           ExitCode.UNREACHABLE)


@click.group("rollout", cls=SuggestingGroup, epilog=_EXAMPLES)
def command() -> None:
    """Shift traffic to a new revision in gated steps; roll back by itself when the canary is worse."""


@command.command("start", epilog=_EXAMPLES)
@click.argument("rollout_file", type=click.Path(dir_okay=False))
@_consul_options
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Write the report there (rollout.json, rollout.md, rollout.png).")
def start(rollout_file, consul_addr, datacenter, token_file, out_dir) -> None:
    """Start the rollout in ROLLOUT_FILE (or take up the same one from Consul) and drive it to its end."""
    from operate.rollout_plan import load_plan
    from operate.rollout_report import status_table, write
    from operate.rollout_run import Controller, begin

    plan = load_plan(rollout_file)
    io = _io(consul_addr, token_file)
    console = app.current().console

    def told(doc, text):
        console.print(f"{time.strftime('%H:%M:%S')} {doc.state} canary {doc.effective_weight * 100:g}%: {text}")

    controller = Controller(io, plan, datacenter, on_event=told)
    try:
        index, doc, resumed = begin(io, plan, datacenter, time.time())
        told(doc, "taken up from Consul" if resumed else f"started: {plan.stable} -> {plan.canary}")
        doc = controller.run(doc, index)
    except ConsulUnavailable as exc:
        raise _unreachable(io, exc) from exc
    console.print(status_table(doc))
    if out_dir:
        for path in write(doc, controller.evaluations, out_dir):
            console.print(f"wrote {path}")
    if doc.state == "aborted":
        raise ClusterctlError(f"rollout {doc.name} aborted: {doc.reason}", ExitCode.FAILED)


@command.command("status", epilog=_EXAMPLES)
@_consul_options
@click.option("--json", "as_json", is_flag=True, help="Print the document as JSON.")
def status(consul_addr, datacenter, token_file, as_json) -> None:
    """Show the rollout in Consul: revisions, weight, state, step and its history."""
    import json

    from operate.rollout_report import status_table
    from operate.rollout_run import read_doc

    io = _io(consul_addr, token_file)
    try:
        _, doc = read_doc(io, datacenter)
    except ConsulUnavailable as exc:
        raise _unreachable(io, exc) from exc
    console = app.current().console
    if doc is None:
        console.print(json.dumps(None) if as_json else f"no rollout in Consul ({layout.rollout_key(datacenter)})")
        return
    if as_json:
        click.echo(json.dumps(doc.to_json(), indent=2))
    else:
        console.print(status_table(doc))


def _operator_command(name: str, summary: str, change):
    @command.command(name, epilog=_EXAMPLES, help=summary)
    @_consul_options
    @click.option("--reason", default=f"{name} by an operator", show_default=True, help="Kept in the history.")
    def run(consul_addr, datacenter, token_file, reason) -> None:
        from operate.rollout_report import status_table
        from operate.rollout_run import operate

        io = _io(consul_addr, token_file)
        try:
            doc = operate(io, datacenter, lambda d: change(d, time.time(), reason))
        except ConsulUnavailable as exc:
            raise _unreachable(io, exc) from exc
        app.current().console.print(status_table(doc))

    return run


def _pause(doc, now, reason):
    from operate.rollout_run import pause_doc

    _must_be(doc, ("progressing",), "pause")
    return pause_doc(doc, now, reason)


def _resume(doc, now, reason):
    from operate.rollout_run import resume_doc

    _must_be(doc, ("paused",), "resume")
    return resume_doc(doc, now)


def _abort(doc, now, reason):
    from operate.rollout_run import abort_doc

    _must_be(doc, ("progressing", "paused", "promoted"), "abort")
    return abort_doc(doc, now, reason)


def _must_be(doc, states: tuple[str, ...], what: str) -> None:
    if doc.state not in states:
        raise ClusterctlError(f"rollout {doc.name} is {doc.state}: nothing to {what}", ExitCode.USAGE)


_operator_command("pause", "Hold the rollout at its weight (no further step) until resumed.", _pause)
_operator_command("resume", "Go on with a paused rollout (the step's hold starts again).", _resume)
_operator_command("abort", "Send every request to stable at once (weight 0); the edges follow within ~1 s.", _abort)
