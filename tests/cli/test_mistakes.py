"""One test per mistake a first-time user made in the operator-experience review: each
answer is one line, with the documented exit code, and names the fix."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cli.main import COMMANDS
from tests.cli.helpers import one_line, stamp_provisioned

REPO = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------ CLI conventions


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


def test_bad_parse_kind_names_kind(clusterctl, tmp_path):
    (tmp_path / "x").write_text("x")
    code, _, err = clusterctl("preflight", "parse", "ncl", str(tmp_path / "x"))
    assert code == 2 and "Invalid value for 'KIND': 'ncl' is unknown; did you mean 'nccl'? (one of: chrony," in err
    code, _, err = clusterctl("preflight", "parse", "zzz", str(tmp_path / "x"))
    assert code == 2 and "Invalid value for 'KIND': 'zzz' is unknown (one of: chrony, cmdline," in err


def test_dev_consul_that_cannot_start_is_exit_2_in_one_line(clusterctl, tmp_path, monkeypatch):
    import logging
    import socket

    # the command configures the root logger (to this test's captured stderr): put it back afterwards
    monkeypatch.setattr(logging.root, "handlers", list(logging.root.handlers))
    monkeypatch.setattr(logging.root, "level", logging.root.level)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        code, _, err = clusterctl("dev", "consul", "--addr", addr)
    assert code == 2 and one_line(err) == f"error: cannot start on {addr}: Address already in use"
    (tmp_path / "state.json").write_text("{not json")
    code, _, err = clusterctl("dev", "consul", "--addr", "127.0.0.1:0", "--data-dir", str(tmp_path))
    assert code == 2 and one_line(err).startswith(f"error: {tmp_path}: unreadable state file (")


def test_completion_script_completes_check_names(monkeypatch, capsys):
    from click.shell_completion import ShellComplete

    from cli.main import cli

    completions = ShellComplete(cli, {}, "clusterctl", "_CLUSTERCTL_COMPLETE").get_completions(
        ["preflight", "--checks"], "gpu_health,ib")
    assert [c.value for c in completions] == ["gpu_health,ib_link_health", "gpu_health,ib_ports",
                                             "gpu_health,ib_pairs"]


# ------------------------------------------------------------------------------ errors name the place


@pytest.fixture
def broken(tmp_path, virtual_inventory):
    """A copy of the virtual inventory to break."""
    import shutil

    def copy(name: str):
        target = tmp_path / name
        shutil.copytree(virtual_inventory, target)
        return target

    return copy


def test_group_vars_yaml_error_names_file_line_and_column(clusterctl, broken):
    inventory = broken("yamlerr")
    with open(inventory / "group_vars" / "all.yml", "a") as f:
        f.write("\nbroken: [1, 2\nnext: value\n")
    lines = (inventory / "group_vars" / "all.yml").read_text().splitlines()
    code, _, err = clusterctl("inventory", "validate", "-i", str(inventory))
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"error: {inventory}/group_vars/all.yml:{len(lines)}:5: YAML: expected ',' or ']'"), line


def test_hosts_yaml_error_is_one_line_with_the_location_and_no_ansible_warnings(clusterctl, broken):
    inventory = broken("yamlerr2")
    (inventory / "hosts.yml").write_text("all:\n  children:\n    rack_r01:\n      hosts:\n        r01n01: {ansible_host: x\n")
    code, _, err = clusterctl("inventory", "validate", "-i", str(inventory))
    assert code == 2
    assert one_line(err) == f"error: {inventory}/hosts.yml:6:1: YAML: expected ',' or '}}', but got '<stream end>'"


def test_ini_error_names_the_file_and_the_ini_plugins_reason(clusterctl, broken):
    inventory = broken("inierr")
    (inventory / "hosts.yml").unlink()
    (inventory / "hosts.ini").write_text("[rack_r01]\nr01n01 ansible_host=127.0.1.11 oops\n")
    code, _, err = clusterctl("inventory", "validate", "-i", str(inventory))
    assert code == 2
    line = one_line(err)
    # the line too: Ansible 2.19's ini plugin drops it from its own error (its Origin's line_num is reset)
    assert line == f"error: {inventory}/hosts.ini:2: INI: Expected key=value host variable assignment, got: oops"
    (inventory / "hosts.ini").write_text("# a comment\n\n[rack_r01:bogus]\nr01n01\n")
    code, _, err = clusterctl("inventory", "validate", "-i", str(inventory))
    assert code == 2 and one_line(err).startswith(f"error: {inventory}/hosts.ini:3: INI: Section [rack_r01:bogus]")


def test_empty_directory_says_what_an_inventory_is(clusterctl, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = clusterctl("inventory", "validate", "-i", str(tmp_path / "empty"))
    assert code == 2 and "no inventory source here" in one_line(err) and "clusterctl virtual create" in err


def test_scores_without_consul_is_one_line_with_address_and_hint_exit_3(clusterctl):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = clusterctl("scores", "--consul", f"127.0.0.1:{port}")
    assert code == 3
    assert one_line(err) == (f"error: cannot reach Consul at 127.0.0.1:{port} (connection refused); address from "
                             "--consul: check it, and that Consul runs there")


def test_scores_names_the_inventory_address_and_never_suggests_the_variable_it_ignored(
        clusterctl, monkeypatch, tmp_path):
    """The inventory's consul_http_addr comes before CONSUL_HTTP_ADDR: the error says the address came from
    the inventory and that the variable was not used, instead of telling the operator to set it."""
    import shutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inventory = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "virtual", inventory)
    group_vars = inventory / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text().replace('consul_http_addr: "{{ ansible_host }}:8500"',
                                                         f"consul_http_addr: 127.0.0.1:{port}"))
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "127.0.0.1:1")
    code, _, err = clusterctl("scores", "-i", str(inventory))
    assert code == 3
    assert one_line(err) == (
        f"error: cannot reach Consul at 127.0.0.1:{port} (connection refused); address from consul_http_addr in "
        f"{inventory}; CONSUL_HTTP_ADDR=127.0.0.1:1 is not used: the inventory's address comes first; pass "
        "--consul HOST:PORT to reach another")
    from cli.commands.scores import address_origin

    monkeypatch.delenv("CONSUL_HTTP_ADDR")
    assert address_origin(None, None, None)[1:] == ("the default address", (
        "the default address (no --consul, no consul_http_addr from -i, no CONSUL_HTTP_ADDR); pass --consul "
        "HOST:PORT, -i INVENTORY, or set CONSUL_HTTP_ADDR"))


def test_scores_with_no_iu_publishing_says_so_and_exits_1(clusterctl, virtual_inventory, consul_addr):
    code, out, _ = clusterctl("scores", "-i", str(virtual_inventory), "--consul", consul_addr, columns=160)
    assert code == 1
    assert out.strip().splitlines()[-1] == "0 of 8 IUs publishing a score"


# ------------------------------------------------------------------------------ virtual


def test_virtual_takes_dash_i_and_the_positional_form_still_works(clusterctl, tmp_path):
    code, out, err = clusterctl("virtual", "create", "-i", str(tmp_path / "a"), "--faults", "none")
    assert code == 0 and err == ""
    assert out.splitlines() == [f"{tmp_path / 'a'}: 4 nodes in 2 racks (h100-sxm, ib); no injected faults",
                                f"next: clusterctl virtual up -i {tmp_path / 'a'}"]
    code, out, err = clusterctl("virtual", "create", str(tmp_path / "b"), "--nodes", "1", "--racks", "1")
    assert code == 0 and "1 node in 1 rack" in out
    assert (tmp_path / "b" / "hosts.yml").read_text().startswith(
        "# A virtual inventory: 1 node of 8x h100-sxm in 1 rack (InfiniBand).\n")  # not "1 rack(s) x 1 node(s)"
    assert err.strip() == f"note: the positional inventory is deprecated; use -i {tmp_path / 'b'}"
    code, _, err = clusterctl("virtual", "status")
    assert code == 2 and "missing -i/--inventory DIR" in err


def test_virtual_up_refuses_to_discard_a_provisioned_cluster(clusterctl, brought_up_inventory, tmp_path, monkeypatch):
    import shutil
    from datetime import datetime

    from sim.hosts import lifecycle, run_state
    from sim.hosts.machines import MachineState

    monkeypatch.chdir(tmp_path)
    ups = []
    running = {"r01n01": "running", "r01n02": "stopped"}

    def fresh_machines(inv, limit, secrets):  # `up` recreates every machine's overlay, as prepare_host does
        ups.append(inv)
        shutil.rmtree(lifecycle.layout(inv).machines_dir, ignore_errors=True)
        return lifecycle.UpResult(list(running), [], 0.1)

    monkeypatch.setattr(lifecycle, "status", lambda inv: [MachineState(h, s, [], "127.0.1.11") for h, s in running.items()])
    monkeypatch.setattr(lifecycle, "up", fresh_machines)
    assert clusterctl("virtual", "up", "-i", str(brought_up_inventory))[0] == 0  # never provisioned: fine
    stamp_provisioned(brought_up_inventory, "r01n02")
    assert clusterctl("virtual", "up", "-i", str(brought_up_inventory))[0] == 0  # provisioned, but not running
    stamp_provisioned(brought_up_inventory, "r01n01", when=1_700_000_000)
    code, _, err = clusterctl("virtual", "up", "-i", str(brought_up_inventory))
    assert code == 2 and len(ups) == 2
    line = one_line(err)
    when = datetime.fromtimestamp(1_700_000_000).strftime("%H:%M:%S")
    assert f"1 machine up and provisioned at {when}" in line and "add --reset" in line
    code, out, _ = clusterctl("virtual", "status", "-i", str(brought_up_inventory))
    assert code == 0 and out.splitlines()[0].split()[2:] == ["running", "healthy", "provisioned", when]
    assert out.splitlines()[1].split()[2:] == ["stopped", "healthy"]
    code, out, _ = clusterctl("virtual", "up", "-i", str(brought_up_inventory), "--reset")
    assert code == 0 and len(ups) == 3 and "next: clusterctl provision" in out
    assert run_state.provisioned(lifecycle.layout(brought_up_inventory)) == {}  # fresh hosts: nothing to lose again


def test_ansible_warnings_are_summarized_once_each(clusterctl, broken):
    inventory = broken("warn")
    text = (inventory / "hosts.yml").read_text().replace("rack_r01:", "rack-r01:")
    (inventory / "hosts.yml").write_text(text)
    code, out, err = clusterctl("inventory", "show", "-i", str(inventory), "--json")
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings and all(": ansible: " in line for line in warnings), err
    assert len(warnings) == len(set(warnings)) and "[WARNING]" not in err and "<<< caused by >>>" not in err


def test_a_group_level_problem_is_one_line_not_one_per_host():
    from cluster.validate import Problem, problem_lines

    problems = [Problem(f"r0{r}n0{n}", "gpu_count", 6, "not divisible by iu_size=4") for r in (1, 2) for n in (1, 2)]
    problems.append(Problem("r01n01", "iu_size", "four", "must be one of 1/2/4/8"))
    assert problem_lines(problems) == [
        "r01n01, r01n02, r02n01, ... (+1) (4 hosts): gpu_count=6: not divisible by iu_size=4",
        "r01n01: iu_size='four': must be one of 1/2/4/8",
    ]


def test_a_bug_exits_70_with_one_line_never_1_which_means_a_check_failed(monkeypatch, capsys, virtual_inventory):
    import cli.commands.inventory
    from cli.main import main
    from common.errors import ExitCode

    def broken(*_args, **_kwargs):
        raise KeyError("racks")

    monkeypatch.setattr(cli.commands.inventory.inv, "load_cluster", broken)
    with pytest.raises(SystemExit) as exited:
        main(["inventory", "show", "-i", str(virtual_inventory)])
    assert exited.value.code == ExitCode.INTERNAL == 70  # before: an uncaught traceback, exit 1
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
        block = (command.epilog or "").partition("Examples:")[2].split("\n\n")[0]
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


def test_the_written_inventory_names_the_dash_i_form(virtual_inventory):
    assert "`clusterctl virtual up -i DIR` creates the simulated hosts." in (virtual_inventory / "hosts.yml").read_text()


def test_virtual_down_where_nothing_was_brought_up_says_so(clusterctl, tmp_path):
    code, out, err = clusterctl("virtual", "down", "-i", str(tmp_path))
    assert code == 0 and err == ""  # idempotent: nothing up is not an error
    assert one_line(out) == (f"{tmp_path}: no simulated machines here (nothing was brought up with "
                             f"`clusterctl virtual up -i {tmp_path}`); nothing to stop")


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
