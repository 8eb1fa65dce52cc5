"""Entry point of ``clusterctl``.

Each top-level command lives in its own module (``cli/<name>.py`` exposing ``command``) and is imported
only when it runs, so ``clusterctl --help`` stays fast and one command's heavy imports (ansible, consul,
rich live views) never slow down another.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

import click

from cli.errors import ClusterctlError
from cli.help import SuggestingGroup, examples

# sysexits.h EX_SOFTWARE: distinct from every documented verdict code (0 pass, 1 fail, 2 usage, 3 unreachable)
INTERNAL_ERROR_EXIT = 70

# name -> (module, one-line help shown by `clusterctl --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "inventory": ("cli.inventory", "Show and validate the cluster model built from an Ansible inventory."),
    "virtual": ("cli.virtual", "Create, start and stop simulated hosts (the virtual inventory)."),
    "provision": ("cli.provision", "Run the provisioning playbooks in stop-on-failure batches."),
    "preflight": ("cli.preflight", "Gate nodes on topology, GPU health, IB, NCCL, C-states, DCQCN, NUMA, time."),
    "dev": ("cli.dev", "Development servers (a Consul-HTTP-API-compatible server for tests and the demo)."),
    "agent": ("cli.agent", "EAS agent helpers (parse a saved vLLM /metrics scrape)."),
    "scores": ("cli.scores", "Show the load scores the EAS agents publish to Consul."),
    "edge": ("cli.edge", "The edge: an OpenAI-compatible router in front of the IUs (eas-edge)."),
    "demo": ("cli.commands.demo", "Run the whole toolkit end to end on a temporary virtual cluster."),
}


class LazyGroup(SuggestingGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[cmd_name][0])
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


EPILOG = examples(
    "clusterctl virtual create mycluster --nodes 4 --racks 2",
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
        "\n\n\b\nShell completion (bash; zsh_source or fish_source for zsh and fish):\n"
        "  eval \"$(_CLUSTERCTL_COMPLETE=bash_source clusterctl)\""
    ),
)


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="clusterctl", prog_name="clusterctl", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Provision, preflight and operate bare-metal LLM inference clusters."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="clusterctl", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
    except ClusterctlError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a bug: never let it exit 1, which preflight and diff document as "a check failed"
        if debug:
            raise
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        click.echo(
            f"internal error (a bug in clusterctl, not a verdict): {type(exc).__name__}: {exc} "
            f"at {Path(frame.filename).name}:{frame.lineno}; rerun with --debug for the traceback",
            err=True,
        )
        sys.exit(INTERNAL_ERROR_EXIT)


if __name__ == "__main__":
    main()
