"""cpu_cstates' Redfish step as written (roles/cpu_cstates/tasks/redfish.yml): every request runs on the
controller, throttled, with no_log and no become. That the requests really leave from the controller on a
simulated host is tests/machines/provision/test_redfish.py."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.unit


def walk(tasks: list[dict]):
    for task in tasks:
        yield task
        yield from walk(task.get("block", []))


def test_every_redfish_request_runs_on_the_controller_throttled():
    tasks = yaml.safe_load((REPO / "roles/cpu_cstates/tasks/redfish.yml").read_text())
    uri_tasks = [t for t in walk(tasks) if "ansible.builtin.uri" in t]
    assert len(uri_tasks) >= 8
    for task in uri_tasks:
        assert task.get("delegate_to") == "localhost", task["name"]
        assert re.fullmatch(r"\{\{ cpu_cstates_redfish_throttle \}\}", str(task.get("throttle"))), task["name"]
        assert task.get("no_log") is True, task["name"]  # every request carries the BMC password
        assert task.get("become") is False, task["name"]  # the play's sudo is for the node, not the controller
