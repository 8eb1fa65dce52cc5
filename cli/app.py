"""What every command shares for one run: the consoles and how much to show.

The root group (:mod:`cli.main`) puts an :class:`App` on the click context from its global options;
a command takes it with :func:`current`. A command run on its own (a test invoking a command object
directly) gets a default one, so nothing depends on a module-level console created at import time
(whose terminal width and colour would be fixed before ``COLUMNS`` or the output stream is known).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import click
from rich.console import Console


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
            self._out = Console(no_color=self.no_color or None)
        return self._out

    @property
    def err_console(self) -> Console:
        """stderr: progress and the report when stdout carries a document (``--json -``)."""
        if self._err is None:
            self._err = Console(stderr=True, no_color=self.no_color or None)
        return self._err

    def report_console(self, document_on_stdout: bool) -> Console:
        """Where the people's report goes: stderr when stdout carries a machine-readable document."""
        return self.err_console if document_on_stdout else self.console


def current() -> App:
    """The run's :class:`App` (a default one when the command runs without the root group)."""
    return click.get_current_context().ensure_object(App)
