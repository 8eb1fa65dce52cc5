"""preflight/checks/os_support.py: ``evaluate`` on os-release facts of real distributions (the supported ones pass,
every other fails naming the distribution and release), ``gather`` through a scripted transport (the kernel is
evidence; an unreadable os-release is an ERROR, never a pass)."""

from __future__ import annotations

import pytest

from preflight.checks import os_support
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node
from tests.helpers.preflight_checks import parsed

pytestmark = pytest.mark.unit

N = node()


def judged(name: str):
    [result] = os_support.CHECK.evaluate({"os": parsed("os-release", name), "kernel": "6.8.0-49-generic"},
                                         profile_of(N), N)
    return result


@pytest.mark.parametrize("name", ["debian12-bookworm.txt", "ubuntu22.04.5-jammy.txt", "ubuntu24.04.1-noble.txt"])
def test_the_supported_releases_pass(name):
    result = judged(name)
    assert (result.verdict, result.code) == (Verdict.PASS, "OS_OK")
    assert result.reason.endswith("kernel 6.8.0-49-generic")


@pytest.mark.parametrize("name, named", [
    ("ubuntu20.04.6-focal.txt", "Ubuntu 20.04.6 LTS (ID=ubuntu, VERSION_ID=20.04)"),
    ("debian11-bullseye.txt", "Debian GNU/Linux 11 (bullseye) (ID=debian, VERSION_ID=11)"),
    ("rocky9.4-blue-onyx.txt", "Rocky Linux 9.4 (Blue Onyx) (ID=rocky, VERSION_ID=9.4)"),
])
def test_other_releases_fail_naming_the_distribution_and_release(name, named):
    result = judged(name)
    assert (result.verdict, result.code) == (Verdict.FAIL, "OS_UNSUPPORTED")
    assert result.reason == f"{named} is not a supported OS; the roles support Debian 12, Ubuntu 22.04, Ubuntu 24.04"
    assert result.evidence["found"]["kernel"] == "6.8.0-49-generic"


def test_a_derivative_is_judged_by_its_own_id_not_id_like():
    """Linux Mint says ID_LIKE=ubuntu: its releases are not Ubuntu's, nor are NVIDIA's repositories built for it."""
    from preflight.parsers.os_release import parse

    mint = parse('NAME="Linux Mint"\nVERSION_ID="21.3"\nID=linuxmint\nID_LIKE="ubuntu debian"\nPRETTY_NAME="Linux Mint 21.3"\n')
    assert os_support.unsupported(mint).startswith("Linux Mint 21.3 (ID=linuxmint, VERSION_ID=21.3)")


def test_gather_reads_os_release_and_the_kernel():
    t = (ScriptedTransport().on("n1", "cat", "/etc/os-release", reply=fixture_text("os_release", "debian12-bookworm.txt"))
         .on("n1", "uname", "-r", reply="6.1.0-28-amd64\n"))
    [result] = os_support.CHECK.run(context(t))
    assert (result.verdict, result.reason) == (Verdict.PASS, "Debian GNU/Linux 12 (bookworm), kernel 6.1.0-28-amd64")


def test_a_host_without_os_release_is_an_error_not_a_pass():
    t = (ScriptedTransport().on("n1", "cat", "/etc/os-release", reply=(1, "cat: /etc/os-release: No such file or directory"))
         .on("n1", "uname", "-r", reply="6.1.0-28-amd64\n"))
    [result] = os_support.CHECK.run(context(t))
    assert result.verdict is Verdict.ERROR


@pytest.mark.parametrize(("name", "distro", "suite"), [("debian12-bookworm.txt", "debian12", "bookworm"),
                                                        ("ubuntu22.04.5-jammy.txt", "ubuntu2204", "jammy"),
                                                        ("ubuntu24.04.1-noble.txt", "ubuntu2404", "noble")])
def test_each_supported_release_names_its_own_repositories(name, distro, suite):
    found = parsed("os-release", name)
    assert os_support.repository_mismatch(found, distro, suite) is None
    assert os_support.repository_mismatch(found, None, None) is None  # a play without the roles checks nothing
    wrong = os_support.repository_mismatch(found, "ubuntu2004", "focal")
    assert f"nvidia_stack_repo_distro=ubuntu2004 is NVIDIA's repository for another release; this host's is {distro}" in wrong
    assert f"consul_agent_repo_suite=focal is HashiCorp's suite for another release; this host's is {suite}" in wrong
