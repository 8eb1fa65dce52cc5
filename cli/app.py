"""What every command shares for one run: the consoles and how much to show.

The root group (:mod:`cli.main`) puts an :class:`App` on the click context from its global options;
a command takes it with :func:`current`. A command run on its own (a test invoking a command object
directly) gets a default one, so nothing depends on a module-level console created at import time
(whose terminal width and colour would be fixed before ``COLUMNS`` or the output stream is known).

Output that is not a terminal (a pipe, a file, a CI log, ``| less``) is laid out :data:`UNWRAPPED` wide
unless ``COLUMNS`` says otherwise: rich folds every line longer than its console's width (80 columns by
default off a terminal), and a table row or a message folded over two lines is lost to ``grep``. It carries
no colour or cursor codes there either (rich writes none to a stream that is not a terminal).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import IO, Any

import click
from rich.console import Console

# Wide enough that no line of a report is folded (a table sizes its columns to their content, not to the
# console, and nothing printed off a terminal fills the width: no rule or panel outside the demo's screen).
UNWRAPPED = 100_000


_TRAILING_SPACES = re.compile(r" +(?=\n)")


class _TrimmedLines:
    """A text stream that drops the spaces rich pads a line with (a table's title and caption are centred over
    its width): a log line ends where its text does."""

    def __init__(self, stream: IO[str]):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(_TRAILING_SPACES.sub("", text))

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, flush, encoding: the stream's own
        return getattr(self._stream, name)


def make_console(*, stderr: bool = False, no_color: bool = False, **options: Any) -> Console:
    """A console for stdout (or stderr): the terminal's width on a terminal; anywhere else :data:`UNWRAPPED`
    (``COLUMNS`` when set, which rich reads itself) and no trailing spaces."""
    console = Console(stderr=stderr, no_color=no_color or None, **options)
    if not console.is_terminal:
        if not os.environ.get("COLUMNS", "").isdigit():
            console.width = UNWRAPPED
        console.file = _TrimmedLines(console.file)
    return console


def stdin_is_terminal() -> bool:
    """Whether a person can answer a question here (a script's or CI's stdin is not a terminal)."""
    return sys.stdin is not None and sys.stdin.isatty()


@dataclass
class App:
    debug: bool = False  # --debug: tracebacks instead of the one-line error
    no_color: bool = False  # --no-color: as NO_COLOR (which rich reads itself)
    _out: Console | None = field(default=None, repr=False)
    _err: Console | None = field(default=None, repr=False)

    @property
    def console(self) -> Console:
        """stdout, created on first use (so it sees the stream pytest or a pipe put there)."""
        if self._out is None:
            self._out = make_console(no_color=self.no_color)
        return self._out

    @property
    def err_console(self) -> Console:
        """stderr: progress and the report when stdout carries a document (``--json -``)."""
        if self._err is None:
            self._err = make_console(stderr=True, no_color=self.no_color)
        return self._err

    def screen_console(self) -> Console:
        """stdout laid out as a screen even off a terminal (the terminal's width, ``COLUMNS`` or rich's 80): for
        a view made of frames, rules and panels (the demo), which fill the width they are given."""
        return Console(no_color=self.no_color or None)

    def report_console(self, document_on_stdout: bool) -> Console:
        """Where the people's report goes: stderr when stdout carries a machine-readable document."""
        return self.err_console if document_on_stdout else self.console


def current() -> App:
    """The run's :class:`App` (a default one when the command runs without the root group)."""
    return click.get_current_context().ensure_object(App)
