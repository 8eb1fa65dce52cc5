"""What every command's ``--help`` shares: an examples epilog, and groups that suggest a near command.

Click only suggests among commands it has already loaded (``Group.commands``); the groups here load
their commands lazily, so :class:`SuggestingGroup` suggests among :meth:`list_commands` instead.
"""

from __future__ import annotations

import re

import click

from common.text import suggest

# An example line is printed verbatim, four columns in: longer than this it is continued with " \" so an
# 80-column terminal never breaks it inside a word and the lines still paste into a shell as one command.
EXAMPLE_WIDTH = 76
# Shell operators kept on one line with the word after them
_JOINS_NEXT = {">", ">>", "<", "|", "2>"}
# Words of an example: a quoted argument ('XID 13 storm') stays one word.
_WORD = re.compile(r"""(?:'[^']*'|"[^"]*"|\S)+""")
# A group's command list shows each command's first sentence, wrapped, never cut mid-phrase; a sentence
# longer than this ends at its last clause (", ", ": ", "; " outside brackets) that fits (``clusterctl -h``).
SUMMARY_LIMIT = 140


def example_lines(line: str, width: int = EXAMPLE_WIDTH) -> list[str]:
    """``line`` as printed lines of at most ``width`` characters: a trailing ``# comment`` that does not fit
    goes on its own line above the command; a long command continues with `` \\`` at a word boundary, its
    later lines indented. A single word longer than ``width`` stays whole."""
    if len(line) <= width:
        return [line]
    command, hash_, comment = line.partition("  #")
    lines = [f"# {comment.strip()}"] if hash_ else []
    words = _WORD.findall(command.rstrip())
    # an option and its value stay on one line ("--from gpu_reset", not "--from \\" then "gpu_reset"), and so
    # do a redirection or pipe and what follows it
    units: list[str] = []
    for word in words:
        last = units[-1] if units else ""
        if (last.startswith("-") and " " not in last and not word.startswith("-")) or last in _JOINS_NEXT:
            units[-1] = f"{last} {word}"
        else:
            units.append(word)
    current = units[0]
    for unit in units[1:]:
        if len(current) + 1 + len(unit) + 2 > width:  # + " \\"
            lines.append(f"{current} \\")
            current = f"    {unit}"
        else:
            current = f"{current} {unit}"
    lines.append(current)
    return lines


def examples(*lines: str, note: str | None = None) -> str:
    """An epilog listing example command lines verbatim (``\\b`` keeps click from rewrapping them)."""
    shown = [part for line in lines for part in example_lines(line)]
    text = "\b\nExamples:\n" + "\n".join(f"  {line}" for line in shown)
    return text + (f"\n\n{note}" if note else "")


def summary(command: click.Command, limit: int = SUMMARY_LIMIT) -> str:
    """A command's line in its group's list: its first sentence, or that sentence's longest run of whole
    clauses within ``limit`` characters."""
    sentence = command.get_short_help_str(10 * limit)
    if len(sentence) <= limit:
        return sentence
    depth, cut = 0, 0
    for i, char in enumerate(sentence[:limit]):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif depth == 0 and char in ",:;" and sentence[i + 1:i + 2] == " ":
            cut = i
    return sentence[:cut] if cut else sentence


class SuggestingGroup(click.Group):
    def resolve_command(self, ctx: click.Context, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            name = click.utils.make_str(args[0])
            options = {opt for param in self.get_params(ctx) for opt in param.opts}
            # `clusterctl version` (kubectl's and helm's spelling) is the option --version here
            hint = f"; did you mean the option '--{name}'?" if f"--{name}" in options else suggest(
                name, self.list_commands(ctx))
            raise click.UsageError(
                f"No such command {name!r}{hint} (commands: {', '.join(self.list_commands(ctx))})", ctx
            ) from exc

    def summary_of(self, ctx: click.Context, name: str) -> str | None:
        """The line for ``name`` in this group's command list; None leaves it out (hidden)."""
        command = self.get_command(ctx, name)
        return None if command is None or command.hidden else summary(command)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, line) for name in self.list_commands(ctx) if (line := self.summary_of(ctx, name)) is not None]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
