"""How a command ended, as every check's message says it: an exit status, a kill by a signal (from Python's
subprocess or from the host's shell), or an SSH channel that closed before any status came."""

from __future__ import annotations

import pytest

from preflight.checks import gpu_topology
from preflight.result import Verdict
from preflight.transport import CommandResult, how_it_ended
from tests.helpers.preflight import ScriptedTransport, context

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("rc", "said"), [
    (0, "exited 0"),
    (3, "exited 3"),
    (128, "exited 128"),
    (137, "was killed by SIGKILL (exit status 137)"),  # 128 + 9: a shell's report
    (143, "was killed by SIGTERM (exit status 143)"),
    (255, "exited 255"),  # 128 + 127: no such signal
    (-9, "was killed by SIGKILL"),  # subprocess's report (the local transport)
    (-11, "was killed by SIGSEGV"),
    (None, "did not finish"),
])
def test_how_a_command_ended(rc, said):
    assert how_it_ended(rc) == said


def test_no_exit_status_is_said_as_such_not_as_a_number():
    result = CommandResult(None, "", "", 0.1, no_exit_status=True)
    assert not result.ok
    assert result.ended() == "ended without an exit status (its SSH channel closed first)"


@pytest.mark.parametrize(("reply", "said"), [
    (CommandResult(None, "", "", 0.1, no_exit_status=True), "ended without an exit status"),
    (CommandResult(137, "", "", 0.1), "was killed by SIGKILL (exit status 137)"),
])
def test_a_checks_error_says_how_its_command_ended(reply, said):
    t = ScriptedTransport().on("n1", "nvidia-smi", reply=reply)
    (result, *_) = gpu_topology.CHECK.run(context(t))
    assert result.verdict == Verdict.ERROR
    assert said in result.reason and "exited -1" not in result.reason and "exited None" not in result.reason
