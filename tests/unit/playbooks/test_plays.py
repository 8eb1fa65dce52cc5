"""The playbooks' plays as files: every play escalates privilege itself."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.unit


def test_every_play_escalates_privilege():
    """The roles write /etc, install packages and start units as root, logged in as an unprivileged user
    (the virtual inventory's ``deploy``, a cloud image's ``ubuntu``). The virtual inventory also sets
    ``ansible_become``, which would hide a play that lost its ``become: true``: hence this check of the files."""
    plays = [(path.name, play) for path in sorted((REPO / "playbooks").glob("*.yml"))
             for play in yaml.safe_load(path.read_text())]
    assert plays
    assert [(name, play.get("hosts")) for name, play in plays
            if not any(k.endswith("import_playbook") for k in play) and play.get("become") is not True] == []


def test_handlers_run_even_when_a_later_task_fails_the_host():
    """A failure after the grub drop-in was written would otherwise lose update-grub for good."""
    import configparser

    config = configparser.ConfigParser()
    config.read(REPO / "ansible.cfg")
    assert config.getboolean("defaults", "force_handlers")
    plays = [(path.name, play) for path in sorted((REPO / "playbooks").glob("*.yml"))
             for play in yaml.safe_load(path.read_text())]
    assert [(name, play.get("name")) for name, play in plays
            if not any(k.endswith("import_playbook") for k in play) and play.get("force_handlers") is not True] == []
