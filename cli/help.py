"""What every command's ``--help`` shares: an examples epilog, and groups that suggest a near command.

Click only suggests among commands it has already loaded (``Group.commands``); the groups here load
their commands lazily, so :class:`SuggestingGroup` suggests among :meth:`list_commands` instead.
"""

from __future__ import annotations

import click

from common.text import suggest


def examples(*lines: str, note: str | None = None) -> str:
    """An epilog listing example command lines verbatim (``\\b`` keeps click from rewrapping them)."""
    text = "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
    return text + (f"\n\n{note}" if note else "")


class SuggestingGroup(click.Group):
    def resolve_command(self, ctx: click.Context, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            name = click.utils.make_str(args[0])
            hint = suggest(name, self.list_commands(ctx))
            raise click.UsageError(
                f"No such command {name!r}{hint} (commands: {', '.join(self.list_commands(ctx))})", ctx
            ) from exc
