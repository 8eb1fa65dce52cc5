"""An unreachable host's reason in the rollout summary: ssh's last line survives a long banner."""


import pytest

from provision.plan import Plan
from provision.rollout import Rollout, unreachable_reason

pytestmark = pytest.mark.unit

CHANGED = (
    "Failed to connect to the host via ssh: @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
    "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
    "IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n"
    "Someone could be eavesdropping on you right now (man-in-the-middle attack)!\n"
    "It is also possible that a host key has just been changed.\n"
    "The fingerprint for the ED25519 key sent by the remote host is\n"
    "SHA256:Qm1cYx2mHn0zr1Zp7n1u9P2VqS8Y9k6XJkq0sL1eY4A.\n"
    "Please contact your system administrator.\n"
    "Add correct host key in /tmp/inv/.sim/ssh/known_hosts to get rid of this message.\n"
    "Offending ED25519 key in /tmp/inv/.sim/ssh/known_hosts:2\n"
    "Host key verification failed.\n"
)


def test_a_changed_host_key_keeps_ssh_s_verdict():
    reason = unreachable_reason(CHANGED)
    assert reason == "Failed to connect to the host via ssh: ... Host key verification failed."
    assert CHANGED[:300].count("Host key verification failed") == 0  # what the old [:300] cut showed


def test_a_short_message_is_kept_whole():
    msg = "Failed to connect to the host via ssh: deploy@127.0.1.12: Permission denied (publickey)."
    assert unreachable_reason(msg) == msg


def test_recap_lists_reboot_pending_hosts_and_rebooted_ones():
    plan = Plan.__new__(Plan)
    rollout = Rollout.__new__(Rollout)
    rollout.__dict__.update(plan=plan, hosts={}, batches_started=0, stats=None, messages=[], reboot_pending={},
                            rebooted=[], diffs=[])
    for host, task, res in [
        ("n1", "Reboot pending", {"msg": "reboot pending: NVIDIA driver 550.127.08 installed (was none)"}),
        ("n2", "Reboot the host", {"changed": True, "rebooted": True}),
        ("n3", "Some task", {"msg": "reboot pending: not from the reboot task"}),
    ]:
        rollout.handle({"event": "runner_on_ok", "event_data": {"host": host, "task": task, "res": res}})
    assert rollout.reboot_pending == {"n1": "NVIDIA driver 550.127.08 installed (was none)"}
    assert rollout.rebooted == ["n2"]
    assert rollout.reboot_line() == ("reboot pending on 1 host (rerun with --allow-reboot): "
                                     "n1: NVIDIA driver 550.127.08 installed (was none)")
    # one reason shared by several hosts is said once, with its hosts
    rollout.reboot_pending = {"n4": "NVIDIA driver 550.127.08 installed (was none)", "n3": "kernel arguments not "
                              "active: x=1", **rollout.reboot_pending}
    assert rollout.reboot_line() == ("reboot pending on 3 hosts (rerun with --allow-reboot): n1, n4: NVIDIA "
                                     "driver 550.127.08 installed (was none); n3: kernel arguments not active: x=1")
