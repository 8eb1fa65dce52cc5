"""README.md's top is a newcomer's path, and its commands are the ones that work: "Two commands" holds
exactly `make demo` and `make test`, and the "Your first hour" block's steps that touch no machine (copy
the sample, validate, plan) are run here as written, from a shell with the venv's bin on PATH. Before the
placeholders are replaced, validate and --plan refuse them; after, both pass."""

from __future__ import annotations

import re
import shlex
import shutil

import pytest

from tests.helpers.inventory import SAMPLE, SAMPLE_VAULT_PASSWORD, fill_placeholders
from tests.helpers.readme import README, block, shell

pytestmark = pytest.mark.integration



def test_two_commands_are_exactly_make_demo_and_make_test():
    assert block("Two commands") == ["make demo", "make test"]


def test_the_readme_opens_with_the_newcomers_sections_and_ends_with_the_module_map():
    headings = re.findall(r"^## (.+)$", README, re.MULTILINE)
    assert headings[:3] == ["Two commands", "clusterctl on your PATH", "Your first hour"]
    assert headings.index("Where things live") > headings.index("Operating")
    assert ".venv/bin" in README.split("## Your first hour")[0]


def test_the_first_hour_goes_from_the_demo_to_a_canary_node():
    steps = block("Your first hour")
    order = ["make demo", "clusterctl virtual create", "clusterctl virtual up", "cp -r inventory/sample",
             "clusterctl inventory validate", "clusterctl provision -i inventory/prod --plan",
             "clusterctl provision -i inventory/prod --limit"]
    found = [next(i for i, line in enumerate(steps) if line.startswith(prefix)) for prefix in order]
    assert found == sorted(found), steps


def test_the_first_hours_commands_that_touch_no_machine_run_as_written(tmp_path):
    steps = block("Your first hour")
    copy = next(line for line in steps if line.startswith("cp -r inventory/sample"))
    validate = next(line for line in steps if line.startswith("clusterctl inventory validate"))
    plan = next(line for line in steps if line.startswith("clusterctl provision") and "--plan" in shlex.split(line))
    shutil.copytree(SAMPLE, tmp_path / "inventory" / "sample")
    home = tmp_path / "home"
    home.mkdir()
    # the sample's values are encrypted with its documented password; a real inventory's with the site's own
    (home / ".vault-pass").write_text(SAMPLE_VAULT_PASSWORD + "\n")
    (home / ".vault-pass").chmod(0o600)

    done = shell(copy, tmp_path, home)
    assert done.returncode == 0, done.stderr
    prod = tmp_path / "inventory" / "prod"
    for line in (validate, plan):  # the copy still holds the sample's placeholders
        done = shell(line, tmp_path, home)
        assert done.returncode == 2, (line, done.stdout, done.stderr)
        assert "group_vars/all/vault.yml: consul_agent_gossip_key" in done.stderr and "REPLACE-ME" in done.stderr
        assert "plan:" not in done.stdout

    assert fill_placeholders(prod) == 36  # "replace every placeholder" (inventory/sample/README.md)
    done = shell(validate, tmp_path, home)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.splitlines() == ["inventory/prod: Consul servers: consul01, consul02, consul03 (dedicated)",
                                        "inventory/prod: OK (11 hosts)"]
    done = shell(plan, tmp_path, home)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("plan: site.yml on 11 hosts of ") and first.endswith("inventory/prod"), first
