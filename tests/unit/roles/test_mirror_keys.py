"""A site mirror that re-signs NVIDIA's or HashiCorp's repository with its own key (aptly publish, Pulp,
Artifactory): nvidia_stack and consul_agent check the key against its pinned fingerprint on the controller before
any task writes, install it under /etc/apt/keyrings and name it in the entry's signed-by; unset, the vendor's key
stays. The role's own expressions, templated in-process with the playbooks' filters."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import REPO, role_tasks
from tests.helpers import render_role_text as render

pytestmark = pytest.mark.unit

KEYS = REPO / "tests/fixtures/openpgp"
MIRROR_FPR = "5B0699B64E745CEDB9005FE0BBC54D2A0998E563"
OTHER_FPR = "92387EC8758AF58673207D9234876D31C63CAD46"
ROLES = {"nvidia_stack": "/etc/apt/keyrings/cuda-mirror.asc", "consul_agent": "/etc/apt/keyrings/hashicorp-mirror.asc"}
# Tasks that only read or decide: a check placed after anything else would fail with something already written.
READ_ONLY = ("ansible.builtin.set_fact", "ansible.builtin.assert")


def task(role: str, file: str, name: str) -> dict:
    return next(t for t in role_tasks(role, file) if t["name"] == name)


def mirror_key(role: str, key: str, fingerprint: str) -> dict:
    """The role's ``_<role>_mirror_key`` fact for these two variables."""
    facts = role_tasks(role, "main.yml")[0]["ansible.builtin.set_fact"]
    return render(facts[f"_{role}_mirror_key"], {f"{role}_mirror_key": key, f"{role}_mirror_key_fingerprint": fingerprint})


@pytest.mark.parametrize("role", ROLES)
def test_the_key_is_checked_before_any_task_writes(role):
    tasks = role_tasks(role, "main.yml")
    check = next(i for i, t in enumerate(tasks) if t["name"] == f"Check the mirror's signing key against {role}_mirror_key_fingerprint")
    assert all(any(module in t for module in READ_ONLY) for t in tasks[:check]), [t["name"] for t in tasks[:check]]
    assert tasks[check]["ansible.builtin.assert"]["that"] == f"_{role}_mirror_key.problem == ''"


@pytest.mark.parametrize("role", ROLES)
def test_a_wrong_key_fails_naming_the_variable_and_both_fingerprints(role):
    fact = mirror_key(role, str(KEYS / "other-rsa2048.asc"), MIRROR_FPR)
    check = task(role, "main.yml", f"Check the mirror's signing key against {role}_mirror_key_fingerprint")
    variables = {f"_{role}_mirror_key": fact}
    assert render("{{ " + check["ansible.builtin.assert"]["that"] + " }}", variables) is False
    assert render(check["ansible.builtin.assert"]["fail_msg"], variables) == (
        f"{role}_mirror_key ({KEYS / 'other-rsa2048.asc'} on the controller) is the key {OTHER_FPR}, not "
        f"{role}_mirror_key_fingerprint {MIRROR_FPR}: not installed")


@pytest.mark.parametrize("role", ROLES)
def test_the_defaults_are_the_vendor_s_key_and_the_specs_declare_both_variables(role):
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults/main.yml").read_text())
    specs = yaml.safe_load((REPO / "roles" / role / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]
    readme = (REPO / "roles" / role / "README.md").read_text()
    for name in (f"{role}_mirror_key", f"{role}_mirror_key_fingerprint"):
        assert defaults[name] == "" and specs["options"][name]["type"] == "str", name
        assert f"| `{name}` | `\"\"` |" in readme, name
    assert mirror_key(role, defaults[f"{role}_mirror_key"], defaults[f"{role}_mirror_key_fingerprint"]) == {
        "armored": "", "fingerprint": "", "problem": ""}
    assert role_tasks(role, "main.yml")[0]["ansible.builtin.set_fact"][f"_{role}_mirror_keyring"] == ROLES[role]


NVIDIA_VARS = {"nvidia_stack_repo_distro": "ubuntu2204", "nvidia_stack_repo_arch": "x86_64",
               "_nvidia_stack_repo": "http://mirror.example.invalid/cuda/ubuntu2204/x86_64",
               "_nvidia_stack_mirror_keyring": ROLES["nvidia_stack"]}


@pytest.mark.parametrize(("key", "signed_by"), [
    ("", "/usr/share/keyrings/cuda-archive-keyring.gpg"), (str(KEYS / "site-mirror-ed25519.gpg"), ROLES["nvidia_stack"])])
def test_the_cuda_entry_names_the_mirror_s_key_only_when_one_is_set(key, signed_by):
    fact = mirror_key("nvidia_stack", key, MIRROR_FPR if key else "")
    variables = {**NVIDIA_VARS, "_nvidia_stack_mirror_key": fact}
    entry = task("nvidia_stack", "repository.yml", "Point cuda-keyring's repository entry at nvidia_stack_repo_url")
    variables |= {name: render(text, variables) for name, text in entry["vars"].items()}
    assert render(entry["ansible.builtin.copy"]["content"], variables) == (
        f"deb [signed-by={signed_by}] http://mirror.example.invalid/cuda/ubuntu2204/x86_64/ /\n")
    install = task("nvidia_stack", "repository.yml", "Install the mirror's signing key")
    remove = task("nvidia_stack", "repository.yml", "Remove the mirror's signing key when none is set")
    assert render("{{ " + install["when"] + " }}", variables) is bool(key)
    assert render("{{ " + remove["when"] + " }}", variables) is not bool(key)
    if key:
        assert render(install["ansible.builtin.copy"]["content"], variables) == (KEYS / "site-mirror-ed25519.asc").read_text()
        assert render(install["ansible.builtin.copy"]["dest"], variables) == ROLES["nvidia_stack"]
    names = [t["name"] for t in role_tasks("nvidia_stack", "repository.yml")]
    assert names.index("Install the mirror's signing key") < names.index(entry["name"]) < names.index(remove["name"])
    refresh = task("nvidia_stack", "repository.yml", "Refresh the apt lists after the repository entry changed")
    assert "_nvidia_stack_mirror_keyring_file is changed" in refresh["when"]  # a new key alone changes no entry


@pytest.mark.parametrize("mirrored", [False, True])
def test_hashicorp_s_entry_carries_the_fetched_key_or_names_the_mirror_s(mirrored):
    fact = mirror_key("consul_agent", (KEYS / "site-mirror-ed25519.asc").read_text() if mirrored else "",
                      MIRROR_FPR if mirrored else "")
    variables = {"_consul_agent_mirror_key": fact, "_consul_agent_mirror_keyring": ROLES["consul_agent"],
                 "_consul_agent_repo_key": {"content": "HashiCorp's key as fetched and pinned"}}
    entry = task("consul_agent", "packages.yml", "Add HashiCorp's apt repository")["ansible.builtin.deb822_repository"]
    assert render(entry["signed_by"], variables) == (
        ROLES["consul_agent"] if mirrored else "HashiCorp's key as fetched and pinned")
    for name in ("Fetch the repository's signing key", "Check the signing key against the pinned fingerprints",
                 "Remove the mirror's signing key when none is set"):
        assert render("{{ " + task("consul_agent", "packages.yml", name)["when"] + " }}", variables) is not mirrored
    install = task("consul_agent", "packages.yml", "Install the mirror's signing key")
    assert render("{{ " + install["when"] + " }}", variables) is mirrored
    names = [t["name"] for t in role_tasks("consul_agent", "packages.yml")]
    assert names.index(install["name"]) < names.index("Add HashiCorp's apt repository")
    refresh = task("consul_agent", "packages.yml", "Refresh the apt lists after the repository entry changed")
    assert "_consul_agent_mirror_keyring_file is changed" in refresh["when"]
