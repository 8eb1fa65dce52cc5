"""``clusterctl edge serve [EAS-EDGE ARGS]``: the edge (``eas-edge``), same flags, same exit codes;
``clusterctl edge calibrate``: check the units' scores through it (cli/commands/edge_calibrate.py)."""

from __future__ import annotations

import click

from cli.commands.edge_calibrate import calibrate
from cli.help import SuggestingGroup, examples

_EXAMPLES = examples("clusterctl edge serve --config /etc/eas-edge/edge.yml",
                     "clusterctl edge serve --listen 127.0.0.1:8080 --consul 127.0.0.1:8500 --agent-port 9105",
                     "clusterctl edge calibrate --endpoint http://127.0.0.1:8080 --requests 1000")


@click.group("edge", cls=SuggestingGroup, epilog=_EXAMPLES)
def command() -> None:
    """The edge: an OpenAI-compatible router in front of the IUs."""


@command.command("serve", epilog=_EXAMPLES,
                 context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def serve(args: tuple[str, ...]) -> None:
    """Run eas-edge, the router, in the foreground; its flags: clusterctl edge serve --help."""
    from edge.main import main

    raise SystemExit(main(list(args)))


command.add_command(calibrate)
