"""``clusterctl completion bash|zsh|fish``: the shell completion script, to eval or save.

The same script as ``_CLUSTERCTL_COMPLETE=bash_source clusterctl``: click's completion of commands,
options, check names and parse KINDs.
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from cli.help import examples

SHELLS = ("bash", "zsh", "fish")


@click.command("completion", epilog=examples(
    "clusterctl completion bash > ~/.local/share/bash-completion/completions/clusterctl",
    "clusterctl completion zsh > ~/.zfunc/_clusterctl",
    note='Or, in ~/.bashrc: eval "$(clusterctl completion bash)"',
))
@click.argument("shell", type=click.Choice(SHELLS))
def command(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish)."""
    root = click.get_current_context().find_root()
    completion = get_completion_class(shell)(root.command, {}, "clusterctl", "_CLUSTERCTL_COMPLETE")
    click.echo(completion.source())
