"""cli/app.py: one App per run on the click context; consoles made when first used."""

from __future__ import annotations

import click
from click.testing import CliRunner

from cli import app
from cli.main import cli
from common.errors import ClusterctlError, ExitCode, UsageError


def test_a_command_run_alone_gets_a_default_app():
    seen = []

    @click.command()
    def probe() -> None:
        seen.append(app.current())

    assert CliRunner().invoke(probe).exit_code == 0
    assert seen[0].debug is False and seen[0] is not None


def test_the_root_group_puts_debug_on_the_app(monkeypatch):
    seen = []

    @click.command("probe")
    def probe() -> None:
        seen.append(app.current())

    monkeypatch.setitem(cli.commands, "probe", probe)
    assert CliRunner().invoke(cli, ["--debug", "probe"]).exit_code == 0
    assert seen[0].debug is True


def test_the_report_goes_to_stderr_when_stdout_carries_a_document():
    run = app.App()
    assert run.report_console(document_on_stdout=True) is run.err_console
    assert run.report_console(document_on_stdout=False) is run.console
    assert run.err_console.stderr and not run.console.stderr


def test_exit_codes_keep_their_documented_values():
    # scripts and CI gate on these numbers: a change of value is a break of contract
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0, "FAILED": 1, "USAGE": 2, "UNREACHABLE": 3, "INTERNAL": 70, "INTERRUPTED": 130}
    assert UsageError("x").exit_code is ExitCode.USAGE
    assert ClusterctlError("x", 3).exit_code is ExitCode.UNREACHABLE


def test_no_color_turns_colour_off_even_when_forced(capsys, monkeypatch, virtual_inventory):
    from tests.helpers import run_cli

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    code, out, _ = run_cli(capsys, "inventory", "show", "-i", str(virtual_inventory))
    assert code == 0 and ("\x1b[36m" in out or "\x1b[1;36m" in out)  # the racks in cyan
    code, out, _ = run_cli(capsys, "--no-color", "inventory", "show", "-i", str(virtual_inventory))
    assert code == 0 and "rack r01" in out and "36m" not in out and "32m" not in out


def test_completion_prints_the_script_click_would(clusterctl):
    code, out, _ = clusterctl("completion", "bash")
    assert code == 0 and "_clusterctl_completion()" in out and "_CLUSTERCTL_COMPLETE=bash_complete" in out
    code, _, err = clusterctl("completion", "tcsh")
    assert code == 2 and err.startswith("error: Invalid value for '{bash|zsh|fish}'")
