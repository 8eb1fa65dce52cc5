"""os_support: the host runs a distribution and release the roles support.

``gather``: ``cat /etc/os-release`` (kind ``os-release``) and the running kernel (``uname -r``, evidence
only); ``evaluate`` (pure) judges the distribution and release against :data:`SUPPORTED`.

What the roles install decides the list: NVIDIA's CUDA apt repository (driver, Fabric Manager, CUDA, NCCL,
``repos/<distro><release>/``), HashiCorp's apt repository (Consul) and Debian-family packages (``apt``,
``dkms``, ``linux-headers-$(uname -r)``). NVIDIA's CUDA Installation Guide for Linux, "System Requirements"
(docs.nvidia.com/cuda/cuda-installation-guide-linux/, table "Native Linux Distribution Support") lists
Ubuntu 24.04 and 22.04 and Debian 12 (since CUDA 12.3, as NVIDIA/nvidia-docker#1791 quotes it) among the
Debian-family releases its repositories carry, and the roles' ``meta/main.yml`` platforms are exactly Ubuntu
jammy/noble and Debian bookworm. The driver's package names in ``nvidia_stack_driver_packages`` are those of
NVIDIA's Ubuntu repositories; its Debian repository packages the driver differently
(NVIDIA/apt-packaging-fabric-manager#2), so a Debian 12 node sets them for its repository. An RPM distribution has no
apt; an older Ubuntu or Debian gets repository paths, package names and DKMS packaging the roles were never
run against. The playbooks assert the same rule before changing anything (``playbooks/tasks/supported_os.yml``,
through the ``supported_os_problem`` filter), so preflight and provisioning never disagree.

Fault codes: OS_UNSUPPORTED, OS_OK.
"""

from __future__ import annotations

from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, NodeContext
from preflight.parsers.os_release import OsRelease
from preflight.result import CheckResult, Verdict

OS_RELEASE = ["cat", "/etc/os-release"]
KERNEL_RELEASE = ["uname", "-r"]
# os-release ID -> the VERSION_IDs the roles support.
SUPPORTED: dict[str, tuple[str, ...]] = {"debian": ("12",), "ubuntu": ("22.04", "24.04")}


def supported_names() -> str:
    """'Debian 12, Ubuntu 22.04, Ubuntu 24.04'."""
    return ", ".join(f"{distro.capitalize()} {version}" for distro, versions in SUPPORTED.items()
                     for version in versions)


def unsupported(found: OsRelease) -> str | None:
    """Why the roles cannot provision this OS (naming it and the supported ones), or None when they can."""
    if found.version_id in SUPPORTED.get(found.id, ()):
        return None
    return (f"{found.pretty_name} (ID={found.id}, VERSION_ID={found.version_id or 'unset'}) is not a supported OS; "
            f"the roles support {supported_names()}")


def repository_mismatch(found: OsRelease, nvidia_distro: str | None, consul_suite: str | None) -> str | None:
    """Why a repository the roles add is another release's (naming the variable, its value and this host's), or
    None. NVIDIA names its CUDA repositories ``<ID><VERSION_ID without dots>`` (ubuntu2204, ubuntu2404, debian12:
    the CUDA installation guide's ``$distro``); HashiCorp's apt suites are release codenames (jammy, noble,
    bookworm: the ``$(lsb_release -cs)`` of HashiCorp's install instructions). A variable the play does not
    carry (None) is not checked."""
    problems = []
    distro = f"{found.id}{(found.version_id or '').replace('.', '')}"
    if nvidia_distro is not None and str(nvidia_distro) != distro:
        problems.append(f"nvidia_stack_repo_distro={nvidia_distro} is NVIDIA's repository for another release; "
                        f"this host's is {distro}")
    codename = found.version_codename
    if consul_suite is not None and codename and str(consul_suite) != codename:
        problems.append(f"consul_agent_repo_suite={consul_suite} is HashiCorp's suite for another release; "
                        f"this host's is {codename}")
    if not problems:
        return None
    return f"{found.pretty_name} runs here: " + "; ".join(problems)


class OsSupport(Check):
    name = "os_support"
    codes = {"OS_UNSUPPORTED": "the distribution or its release is not one the roles support"}

    def gather(self, ctx: NodeContext) -> dict[str, Any]:
        return {"os": ctx.parsed("os-release", OS_RELEASE), "kernel": ctx.output(KERNEL_RELEASE).strip()}

    def evaluate(self, facts: dict[str, Any], profile: dict[str, Any], node: Node) -> list[CheckResult]:
        found: OsRelease = facts["os"]
        evidence = {
            "expected": {"supported": {distro: list(versions) for distro, versions in SUPPORTED.items()}},
            "found": {"id": found.id, "version_id": found.version_id, "pretty_name": found.pretty_name,
                      "kernel": facts["kernel"]},
        }
        problem = unsupported(found)
        if problem is not None:
            return [self.result(node, Verdict.FAIL, "OS_UNSUPPORTED", problem, **evidence)]
        kernel = f", kernel {facts['kernel']}" if facts["kernel"] else ""  # a pasted os-release shows none
        return [self.result(node, Verdict.PASS, "OS_OK", found.pretty_name + kernel, **evidence)]


CHECK = OsSupport()
