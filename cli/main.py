"""Entry point of ``clusterctl``.

Each top-level command lives in its own module (``cli/commands/<name>.py`` exposing ``command``) and is
imported only when it runs (:class:`cli.lazy.LazyGroup`), so ``clusterctl --help`` stays fast and one
command's heavy imports (ansible, consul, rich live views) never slow down another.

Errors have one format, ``error: ...`` on stderr: a :class:`ClusterctlError` prints one line and exits with
its code; a usage mistake click finds (an unknown option, a bad value) prints one line naming the command's
``-h`` and exits 2; anything else is a bug and exits :attr:`ExitCode.INTERNAL` with one line naming where.
``--debug`` (anywhere on the command line, as kubectl's global flags) adds the traceback and keeps the exit
code, so a script run with it still tells a verdict from a usage mistake from a bug.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import click

from cli.app import App
from cli.help import examples
from cli.lazy import Lazy, LazyGroup
from common.errors import ClusterctlError, ExitCode

# name -> module and the one-line help shown by `clusterctl --help`
COMMANDS: dict[str, Lazy] = {
    "inventory": Lazy("cli.commands.inventory", "Show and validate the cluster model built from an Ansible inventory."),
    "virtual": Lazy("cli.commands.virtual", "Create, start and stop simulated hosts (the virtual inventory)."),
    "provision": Lazy("cli.commands.provision", "Run the provisioning playbooks in stop-on-failure batches."),
    "preflight": Lazy("cli.commands.preflight",
                      "Gate nodes on topology, GPU health, IB, NCCL, C-states, DCQCN, NUMA, time."),
    "dev": Lazy("cli.commands.dev", "Development servers (a Consul-HTTP-API-compatible server for tests and the demo)."),
    "agent": Lazy("cli.commands.agent", "EAS agent helpers (parse a saved vLLM /metrics scrape)."),
    "scores": Lazy("cli.commands.scores", "Show the load scores the EAS agents publish to Consul."),
    "edge": Lazy("cli.commands.edge", "The edge: an OpenAI-compatible router in front of the IUs (eas-edge)."),
    "loadtest": Lazy("cli.commands.loadtest",
                     "Send a traffic mix to an OpenAI-compatible endpoint and judge it against latency SLOs."),
    "drill": Lazy("cli.commands.drill",
                  "Fault drills: a unit or node faulted under load, what clients saw, recovery (--list)."),
    "remediate": Lazy("cli.commands.remediate",
                      "Bring an unhealthy unit back (drain, restart, GPU reset) or mark its node for repair."),
    "rollout": Lazy("cli.commands.rollout",
                    "Shift traffic to a new revision in gated steps; roll back by itself when it is worse."),
    "demo": Lazy("cli.commands.demo", "Run the whole toolkit end to end on a temporary virtual cluster."),
    "completion": Lazy("cli.commands.completion", "Print the shell completion script (bash, zsh, fish)."),
}


EPILOG = examples(
    "clusterctl virtual create -i mycluster --nodes 4 --racks 2",
    "clusterctl inventory validate -i inventory/prod",
    "clusterctl provision -i inventory/prod --limit rack_r12 --plan",
    "clusterctl preflight -i inventory/prod --limit rack_r12",
    "clusterctl scores -i inventory/prod",
    note=(
        "Secrets: the Consul ACL token and BMC passwords live in the inventory as ansible-vault values or "
        "files. --vault-password-file FILE (on every command that reads an inventory) names the vault "
        "password: a file of mode 0600 (readable by group or others is refused, exit 2) or an executable "
        "vault password script; only its path is passed on, never the password. Without it, what "
        "Ansible's configuration names (ANSIBLE_VAULT_PASSWORD_FILE, vault_password_file in ansible.cfg)."
        "\n\nOutput: colour only on a terminal; --no-color or NO_COLOR=1 turns it off. Tables fit the "
        "terminal, or COLUMNS; off a terminal (a pipe, a file, a CI log) no line is folded."
        "\n\n\b\nShell completion (bash; zsh or fish likewise):\n"
        "  eval \"$(clusterctl completion bash)\""
    ),
)


@click.group(cls=LazyGroup, lazy=COMMANDS, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="clusterctl", prog_name="clusterctl", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors (the exit code stays the error's).")
@click.option("--no-color", is_flag=True, help="No colour (as NO_COLOR=1).")
@click.pass_context
def cli(ctx: click.Context, debug: bool, no_color: bool) -> None:
    """Provision, preflight and operate bare-metal LLM inference clusters."""
    ctx.obj = App(debug=debug, no_color=no_color)


def _debug_first(args: list[str]) -> tuple[list[str], bool]:
    """``args`` with every ``--debug`` before a ``--`` moved to the front (the group's option), and whether
    there was one."""
    end = args.index("--") if "--" in args else len(args)
    rest = [a for a in args[:end] if a != "--debug"] + args[end:]
    debug = len(rest) < len(args)
    return (["--debug", *rest] if debug else rest), debug


def _usage_error(exc: click.ClickException) -> str:
    """click's usage errors in the one format: ``error: MESSAGE (see: clusterctl COMMAND -h)``."""
    ctx = getattr(exc, "ctx", None)
    see = f" (see: {ctx.command_path} -h)" if isinstance(exc, click.UsageError) and ctx is not None else ""
    return f"error: {exc.format_message()}{see}"


def main(argv: list[str] | None = None) -> None:
    args, debug = _debug_first(list(argv if argv is not None else sys.argv[1:]))
    try:
        cli.main(args=args, prog_name="clusterctl", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:  # `clusterctl` or a group alone: its help, as asked
        click.echo(exc.ctx.get_help())
        sys.exit(ExitCode.OK)
    except click.ClickException as exc:
        if debug:
            traceback.print_exc()
        click.echo(_usage_error(exc), err=True)
        sys.exit(ExitCode.USAGE if isinstance(exc, click.UsageError) else exc.exit_code)
    except ClusterctlError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(ExitCode.INTERRUPTED)
    except Exception as exc:  # a bug: never exit 1, which preflight and diff document as "a check failed"
        if debug:
            traceback.print_exc()
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        click.echo(
            f"internal error (a bug in clusterctl, not a verdict): {type(exc).__name__}: {exc} "
            f"at {Path(frame.filename).name}:{frame.lineno}"
            + ("" if debug else "; rerun with --debug for the traceback"),
            err=True,
        )
        sys.exit(ExitCode.INTERNAL)


if __name__ == "__main__":
    main()
