"""The CLI as a whole (cli/main.py): help, typos and option suggestions, completion, help examples, and a bug
that exits 70 in one line. Each mistake a first-time user makes is answered in one line, with the documented
exit code, and names the fix."""

from __future__ import annotations

import pytest

from cli.main import COMMANDS
from tests.helpers.cli import one_line

pytestmark = pytest.mark.unit


def test_version_and_short_help(clusterctl):
    code, out, _ = clusterctl("--version")
    assert code == 0 and out.startswith("clusterctl ") and out.split()[1][0].isdigit()
    for args in (["-h"], ["provision", "-h"], ["preflight", "diff", "-h"], ["virtual", "up", "-h"]):
        code, out, _ = clusterctl(*args)
        assert code == 0 and out.startswith("Usage: clusterctl"), args


def test_a_top_level_typo_suggests_the_command(clusterctl):
    code, _, err = clusterctl("preflite")
    assert code == 2
    assert err.startswith("error: No such command 'preflite'; did you mean 'preflight'?")
    code, _, err = clusterctl("preflight", "hstory")
    assert code == 2 and "did you mean 'history'?" in err


def test_a_command_that_is_an_option_here_names_the_option(clusterctl):
    """kubectl, helm and terraform users type `version`; here it is --version, not the nearest command."""
    code, _, err = clusterctl("version")
    assert code == 2 and err.startswith("error: No such command 'version'; did you mean the option '--version'?")
    code, _, err = clusterctl("inventory", "show-all")
    assert code == 2 and "did you mean 'show'?" in err


def test_an_option_typo_suggests_the_option(clusterctl, virtual_inventory):
    code, _, err = clusterctl("inventory", "show", "-i", str(virtual_inventory), "--limt", "x")
    assert code == 2 and "Did you mean '--limit'?" in err


def all_commands():
    """(path, command) for every command and subcommand, through the lazy groups."""
    import click

    from cli.main import cli

    ctx = click.Context(cli)
    found = []

    def walk(group, path):
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            found.append(([*path, name], command))
            if isinstance(command, click.Group):
                walk(command, [*path, name])

    walk(cli, [])
    return found


def test_every_help_has_an_example_and_the_vault_text_is_in_one_place(clusterctl):
    code, root, _ = clusterctl("--help")
    root = " ".join(root.split())
    assert "Examples:" in root and "mode 0600 (readable by group or others is refused" in root
    assert 'eval "$(clusterctl completion bash)"' in root
    paths = [path for path, _ in all_commands()]
    assert {p[0] for p in paths} == set(COMMANDS)
    for path in paths:
        code, out, _ = clusterctl(*path, "--help", columns=100)
        assert code == 0, path
        assert "Examples:" in out, f"clusterctl {' '.join(path)} --help has no example"
        assert "readable by group or others" not in out, f"{path}: the vault paragraph is repeated"


def test_every_help_page_fits_80_columns_and_no_summary_is_cut(clusterctl):
    """An example longer than the terminal broke inside a word (``--fabri`` / ``c mixed``), and a group's
    command list cut each summary mid-phrase with "..."."""
    for path in [[], *(path for path, _ in all_commands())]:
        code, out, _ = clusterctl(*path, "--help", columns=80)
        assert code == 0, path
        body = out.split("\n", 1)[1]  # click's own usage line ends "[ARGS]..."
        too_long = [line for line in body.splitlines() if len(line) > 80]
        assert not too_long, f"clusterctl {' '.join(path)} --help: {too_long}"
        commands = body.partition("Commands:")[2].partition("Examples:")[0]
        assert "..." not in commands and "``" not in commands, path  # no reST markup in a summary either


def test_a_long_example_continues_at_a_word_boundary_and_a_long_comment_goes_above_it():
    from cli.help import example_lines

    line = "clusterctl remediate -i inventory/prod --target r12n03-iu0 --from gpu_reset --apply   # GPU at fault: reset"
    assert example_lines(line) == ["# GPU at fault: reset",
                                   "clusterctl remediate -i inventory/prod --target r12n03-iu0 \\",
                                   "    --from gpu_reset --apply"]
    quoted = "clusterctl remediate -i inventory/prod --target r12n03-iu1 --apply --reason 'XID 13 storm on GPU 2'"
    assert example_lines(quoted)[-1] == "    --reason 'XID 13 storm on GPU 2'"
    assert example_lines("clusterctl scores") == ["clusterctl scores"]
    redirected = "clusterctl completion bash > ~/.local/share/bash-completion/completions/clusterctl"
    assert example_lines(redirected) == ["clusterctl completion bash \\",
                                         "    > ~/.local/share/bash-completion/completions/clusterctl"]


def test_every_option_has_help_text():
    import click

    for path, command in all_commands():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, f"clusterctl {' '.join(path)} {param.opts[0]} has no help text"


def test_valid_values_are_listed_in_help(clusterctl):
    def words(*args):
        return " ".join(clusterctl(*args)[1].split())

    assert "gpu_topology, gpu_health, pcie_link, nvlink" in words("preflight", "--help")
    assert "Comma-separated tags of site.yml: chrony, consul_agent" in words("provision", "--help")
    out = words("preflight", "parse", "--help")
    assert "KIND is one of: chrony, cmdline, cpulist, cpupower" in out and "Usage: clusterctl preflight parse [OPTIONS] KIND FILE" in out


def test_completion_script_completes_check_names(monkeypatch, capsys):
    from click.shell_completion import ShellComplete

    from cli.main import cli

    completions = ShellComplete(cli, {}, "clusterctl", "_CLUSTERCTL_COMPLETE").get_completions(
        ["preflight", "--checks"], "gpu_health,ib")
    assert [c.value for c in completions] == ["gpu_health,ib_link_health", "gpu_health,ib_ports",
                                             "gpu_health,ib_pairs"]


def test_a_bug_exits_70_with_one_line_never_1_which_means_a_check_failed(monkeypatch, capsys, virtual_inventory):
    import cli.commands.inventory
    from cli.main import main
    from common.errors import ExitCode

    def broken(*_args, **_kwargs):
        raise KeyError("racks")

    monkeypatch.setattr(cli.commands.inventory.inv, "load_cluster", broken)
    with pytest.raises(SystemExit) as exited:
        main(["inventory", "show", "-i", str(virtual_inventory)])
    assert exited.value.code == ExitCode.INTERNAL == 70  # guards against: an uncaught traceback, exit 1
    err = one_line(capsys.readouterr().err)
    assert err.startswith("internal error (a bug in clusterctl, not a verdict): KeyError: 'racks' at ")
    assert "--debug" in err
    with pytest.raises(SystemExit) as exited:  # --debug adds the traceback and keeps the code
        main(["--debug", "inventory", "show", "-i", str(virtual_inventory)])
    assert exited.value.code == ExitCode.INTERNAL and "Traceback" in capsys.readouterr().err


def help_examples():
    """(help page path, example argv after ``clusterctl``) for every example line of every --help page."""
    import shlex

    from cli.main import cli

    found = []
    for path, command in [([], cli), *all_commands()]:
        block = (command.epilog or "").partition("Examples:")[2].split("\n\n")[0].replace(" \\\n", " ")
        for line in block.splitlines():
            part = next((p for p in line.split("#")[0].split("|") if "clusterctl " in p), None)
            if part:
                words = shlex.split(part)
                found.append((path, words[words.index("clusterctl") + 1:]))
    return found


def test_no_help_example_uses_the_deprecated_positional_inventory():
    # `clusterctl --help` showed `virtual create mycluster ...`, which answers with the deprecation note.
    from cli.main import cli

    examples = [(path, argv) for path, argv in help_examples() if argv[0] == "virtual"]
    assert len(examples) >= 6
    for path, argv in examples:
        ctx = cli.make_context("clusterctl", list(argv))
        name, sub, rest = ctx.command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        group = sub.make_context(name, rest, parent=ctx)
        name, leaf, rest = sub.resolve_command(group, [*group._protected_args, *group.args])
        params = leaf.make_context(name, rest, parent=group).params
        assert params["positional"] is None and params["inventory"], f"clusterctl {' '.join(path)} --help: {argv}"


@pytest.mark.parametrize("where", ["first", "last"])
def test_debug_adds_the_traceback_and_keeps_every_exit_code(capsys, monkeypatch, tmp_path, virtual_inventory, where):
    """--debug is accepted before or after the subcommand; an inventory mistake stays 2 and a bug 70 (a
    script running with --debug must not read either as 1, "a check failed")."""
    import cli.commands.inventory
    from cli.main import main
    from common.errors import ExitCode

    broken = tmp_path / "yaml"
    (broken / "group_vars").mkdir(parents=True)
    (broken / "hosts.yml").write_text("all:\n  hosts:\n    n1:\n")
    (broken / "group_vars" / "all.yml").write_text("numa_tuning: enabled: true\n")

    def run(*args: str) -> tuple[int, str]:
        argv = ["--debug", *args] if where == "first" else [*args, "--debug"]
        with pytest.raises(SystemExit) as exited:
            main(argv)
        return exited.value.code, capsys.readouterr().err

    code, err = run("inventory", "validate", "-i", str(broken))
    assert code == ExitCode.USAGE and "Traceback" in err
    assert err.splitlines()[-1].startswith(f"error: {broken}/group_vars/all.yml:1:21: YAML: ")

    def bug(*_args, **_kwargs):
        raise KeyError("racks")

    monkeypatch.setattr(cli.commands.inventory.inv, "load_cluster", bug)
    code, err = run("inventory", "show", "-i", str(virtual_inventory))
    assert code == ExitCode.INTERNAL and "Traceback" in err and "rerun with --debug" not in err


def test_usage_mistakes_use_the_one_error_format(clusterctl):
    """click's usage errors read as every other error: one ``error:`` line naming the command's -h."""
    code, out, err = clusterctl("inventory", "valdate", "-i", "x")
    assert (code, out) == (2, "")
    assert err == ("error: No such command 'valdate'; did you mean 'validate'? (commands: show, validate) "
                   "(see: clusterctl inventory -h)\n")
    code, _, err = clusterctl("preflight", "--depth", "deep", "-i", "x")
    assert code == 2 and err == ("error: Invalid value for '--depth': 'deep' is not one of 'quick', 'standard', "
                                 "'full'. (see: clusterctl preflight -h)\n")
    code, _, err = clusterctl("provision", "--plan")
    assert code == 2 and err == "error: Missing option '-i' / '--inventory'. (see: clusterctl provision -h)\n"


def test_clusterctl_alone_prints_its_help_and_exits_0(capsys):
    from cli.main import main

    with pytest.raises(SystemExit) as exited:
        main([])
    out, err = capsys.readouterr()
    assert exited.value.code == 0 and out.startswith("Usage: clusterctl") and err == ""
