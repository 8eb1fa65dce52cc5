"""What a role fetches over HTTP(S) from the host itself (not through apt, which has its own proxy setting) goes
through the site's proxy: sudo's env_reset drops the login's proxy variables, so each such task carries
``environment: "{{ clusterctl_proxy_env }}"``, and every role with one declares the variable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.unit

PROXY_ENV = "{{ clusterctl_proxy_env }}"


def tasks_of(path: Path) -> Iterator[dict]:
    def walk(tasks: list[dict]) -> Iterator[dict]:
        for task in tasks or []:
            yield task
            for key in ("block", "rescue", "always"):
                yield from walk(task.get(key, []))
    yield from walk(yaml.safe_load(path.read_text()))


def fetches(task: dict) -> bool:
    """A download by the module on the host: get_url, pip, apt's deb from a URL, uri of a repository."""
    if "ansible.builtin.get_url" in task or "ansible.builtin.pip" in task:
        return True
    apt = task.get("ansible.builtin.apt") or {}
    if "://" in str(apt.get("deb", "")) or "{{" in str(apt.get("deb", "")):
        return True
    uri = task.get("ansible.builtin.uri") or {}
    return "_repo_url" in str(uri.get("url", ""))


def fetching_tasks() -> list[tuple[str, str, dict]]:
    return [(path.parts[-3], task["name"], task) for path in sorted((REPO / "roles").glob("*/tasks/*.yml"))
            for task in tasks_of(path) if fetches(task)]


def test_the_fetching_tasks_are_found():
    names = {(role, name) for role, name, _ in fetching_tasks()}
    assert ("nvidia_stack", "Install cuda-keyring (NVIDIA's repository entry and signing key)") in names
    assert ("consul_agent", "Fetch the repository's signing key") in names
    assert ("inference_unit", "Install the pinned vLLM into its virtualenv") in names
    assert {role for role, _, _ in fetching_tasks()} == {"nvidia_stack", "consul_agent", "eas_agent", "eas_edge", "inference_unit"}


def test_every_fetch_from_the_host_takes_the_proxy_environment():
    assert [(role, name) for role, name, task in fetching_tasks() if task.get("environment") != PROXY_ENV] == []


def test_every_role_that_fetches_declares_the_proxy_variable():
    for role in {role for role, _, _ in fetching_tasks()}:
        defaults = yaml.safe_load((REPO / "roles" / role / "defaults/main.yml").read_text())
        assert defaults.get("clusterctl_proxy_env") == {}, role
        specs = yaml.safe_load((REPO / "roles" / role / "meta/argument_specs.yml").read_text())
        assert specs["argument_specs"]["main"]["options"]["clusterctl_proxy_env"]["type"] == "dict", role
        assert "`clusterctl_proxy_env`" in (REPO / "roles" / role / "README.md").read_text(), role
