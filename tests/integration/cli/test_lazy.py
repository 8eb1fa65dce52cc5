"""cli/lazy.py, the one lazy-group mechanism: subcommands import only when they run, and
``clusterctl --help`` imports no command module at all."""

from __future__ import annotations

import subprocess
import sys
import types

import click
import pytest

from cli.lazy import Lazy, LazyGroup

pytestmark = pytest.mark.integration


@pytest.fixture
def fake_module(monkeypatch):
    """A module ``fake_cmd_module`` exposing ``command``, recording whether it was imported."""
    imported = []

    @click.command("hello")
    def command() -> None:
        """Say hello (its own short help)."""
        click.echo("hello")

    module = types.ModuleType("fake_cmd_module")
    module.command = command

    def finder(name, *args, **kwargs):
        imported.append(name)
        return module

    monkeypatch.setattr("cli.lazy.importlib.import_module", finder)
    return imported


def group(**lazy: Lazy) -> LazyGroup:
    grp = LazyGroup("g", lazy=lazy)
    grp.add_command(click.Command("eager", help="Added with add_command."))
    return grp


def test_lists_lazy_and_added_commands_without_importing(fake_module):
    grp = group(hello=Lazy("fake_cmd_module", "One line from the table."))
    ctx = click.Context(grp)
    assert grp.list_commands(ctx) == ["eager", "hello"]
    assert "One line from the table." in grp.get_help(ctx)
    assert fake_module == []  # the table's line: nothing imported to draw the help


def test_a_lazy_command_is_imported_when_resolved(fake_module):
    grp = group(hello=Lazy("fake_cmd_module"))
    ctx = click.Context(grp)
    assert grp.get_command(ctx, "nope") is None and fake_module == []
    assert grp.get_command(ctx, "hello").name == "hello" and fake_module == ["fake_cmd_module"]


def test_without_a_table_line_the_help_shows_the_commands_own(fake_module):
    grp = group(hello=Lazy("fake_cmd_module"))
    assert "Say hello (its own short help)." in grp.get_help(click.Context(grp))


def test_a_typo_suggests_among_lazy_commands():
    grp = group(hello=Lazy("fake_cmd_module"))
    with pytest.raises(click.UsageError, match="did you mean 'hello'"):
        grp.resolve_command(click.Context(grp), ["helo"])


def test_clusterctl_help_imports_no_command_module():
    probe = ("import sys; from cli.main import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith(('cli.commands.', 'ansible', 'provision'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
