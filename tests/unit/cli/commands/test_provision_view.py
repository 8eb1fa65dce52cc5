"""`clusterctl provision`'s live view and recap at 80/100/160 columns and piped, with the role task names
as long as they really are: every header, host name, status and count whole; only the task is cut, with
an ellipsis, to the columns the others leave it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.commands.provision import live_view, recap_table
from provision.plan import Plan
from provision.rollout import Rollout
from tests.helpers.cli import check_snapshot, render_at

pytestmark = pytest.mark.unit

WIDTHS = [80, 100, 160, None]
IDS = ["80", "100", "160", "piped"]
HEADERS = ("host", "batch", "status", "task", "ok", "changed", "failed")
# Long task names of the roles, as ansible-runner reports them (templates rendered).
KEYRING_TASK = "Reinstall cuda-keyring with its missing files /usr/share/keyrings/cuda-archive-keyring.gpg"
PERSISTENCED_TASK = "Enable and start nvidia-persistenced and, on NVSwitch systems, Fabric Manager"


def ev(kind: str, **data) -> dict:
    return {"event": kind, "event_data": data}


def plan(hosts=("r01n01", "r01n02", "r02n01", "r02n02", "r03n01")) -> Plan:
    return Plan(inventory=Path("inventory/prod"), playbook=Path("playbooks/site.yml"), hosts=tuple(hosts),
                batches=(tuple(hosts[:1]), tuple(hosts[1:4]), tuple(hosts[4:])), batch_sizes=(1, "50%", "100%"),
                roles=())


def mid_run() -> Rollout:
    """Batch 2 of 3 running: r01n01 done, two hosts on long tasks, one unreachable; r03n01 waits for batch 3."""
    rollout = Rollout(plan(), clock=lambda: 12.0)
    for event in [
        ev("playbook_on_play_start"),
        ev("runner_on_start", host="r01n01", task="Write chrony.conf"),
        ev("runner_on_ok", host="r01n01", task="Write chrony.conf", res={"changed": True}),
        ev("playbook_on_play_start"),
        ev("runner_on_start", host="r01n02", task=KEYRING_TASK),
        ev("runner_on_ok", host="r01n02", task="Write chrony.conf", res={"changed": True}),
        ev("runner_on_start", host="r01n02", task=KEYRING_TASK),
        ev("runner_on_start", host="r02n01", task=PERSISTENCED_TASK),
        ev("runner_on_unreachable", host="r02n02", task="Gathering Facts", res={"msg": "ssh: connect refused"}),
    ]:
        rollout.handle(event)
    return rollout


def finished() -> Rollout:
    rollout = mid_run()
    rollout.handle(ev("runner_on_failed", host="r02n01", task=PERSISTENCED_TASK, res={"msg": "unit not found"}))
    rollout.handle(ev("playbook_on_stats", ok={"r01n01": 1, "r01n02": 1, "r02n01": 0}, changed={"r01n01": 1},
                      failures={"r02n01": 1}, dark={"r02n02": 1}))
    return rollout


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_live_view_snapshot(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render_at(lambda _: live_view(mid_run()), width)
    check_snapshot(f"provision_live_{width or 'piped'}.txt", text)
    lines = text.splitlines()
    assert all(len(line) <= (width or 80) for line in lines), "a line is wider than the terminal"
    assert lines[1].split() == list(HEADERS)
    rows = {line.split()[0]: line for line in lines[2:]}
    assert set(rows) == {"r01n01", "r01n02", "r02n01", "r02n02", "r03n01"}
    assert rows["r01n02"].split()[:3] == ["r01n02", "2", "running"]
    assert rows["r02n02"].split() == ["r02n02", "2", "unreachable", "0", "0", "0"]
    assert rows["r03n01"].split() == ["r03n01", "3", "waiting", "0", "0", "0"]
    assert rows["r01n02"].split()[-3:] == ["1", "1", "0"]  # the counts, whole, after the cut task
    if width == 160:
        assert KEYRING_TASK in text and "…" not in text
    else:  # only the task column is cut: what follows its ellipsis is the three counts
        assert KEYRING_TASK not in text
        cut = [line for line in lines if "…" in line]
        assert cut and all(len(line.split("…")[1].split()) == 3 for line in cut)

@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_recap_snapshot(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render_at(lambda _: recap_table(finished()), width)
    check_snapshot(f"provision_recap_{width or 'piped'}.txt", text)
    assert all(len(line) <= (width or 80) for line in text.splitlines())
    assert "…" not in text
    for header in ("host", "batch", "status", "ok", "changed", "failed", "skipped", "unreachable"):
        assert f" {header} " in text
    assert "│ r02n01 │     2 │ failed      │" in text and "│ r03n01 │     3 │ not started │" in text


def test_recap_of_long_host_names_is_a_line_per_host_not_cut_names():
    hosts = ("gpu-node-r12n03.dc1.example", "gpu-node-r12n04.dc1.example")
    rollout = Rollout(plan(hosts), clock=lambda: 0.0)
    rollout.handle(ev("playbook_on_stats", ok={hosts[0]: 1}, dark={hosts[1]: 1}))
    text = render_at(lambda _: recap_table(rollout), 80)
    assert text.splitlines() == [  # each host's line wraps at a space, never cut
        "provision recap",
        f"{hosts[0]}  batch 1  ok  ok=1 changed=0 failed=0 skipped=0 ",
        "unreachable=0",
        f"{hosts[1]}  batch 2  unreachable  ok=0 changed=0 failed=0 ",
        "skipped=0 unreachable=1",
    ]
    assert "┃ host" in render_at(lambda _: recap_table(rollout), 120)  # where the table fits, the table
