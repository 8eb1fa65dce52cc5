"""What every transport returns and promises: :class:`CommandResult`, the :class:`Transport` and
:class:`Background` protocols, and the per-stream output cap both transports enforce."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cluster.model import Node

READ_CHUNK = 65536
# Per stream of one command. The largest output preflight reads is `nvidia-smi -q` on 8 GPUs: 24.9 KB
# (tests/fixtures/preflight/nvsmi_q/h100-sxm-driver535-full-q-clean.txt, the largest of the preflight
# fixtures; the kernel log is filtered on the host to the lines a check counts). 4 MiB is ~170 times that,
# and bounds the controller at 64 nodes x 2 streams x 4 MiB = 512 MiB in the worst case, where an unfiltered
# kernel log in an XID storm was hundreds of MB per node.
OUTPUT_CAP_BYTES = 4 * 2**20


@dataclass(frozen=True)
class CommandResult:
    rc: int | None  # None when the process was killed on timeout or never started
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    unreachable: bool = False  # the host itself did not answer (connection failed)
    argv: tuple[str, ...] = ()
    truncated: bool = False  # a stream went over OUTPUT_CAP_BYTES: reading stopped, the command was ended
    # SSH: the channel closed before the host sent the command's exit status (rc is None): sshd or the
    # connection went away under it. A command killed by a signal is not this: the shell on the host reports
    # it as 128 + the signal's number (remote_command).
    no_exit_status: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out and not self.unreachable and not self.truncated

    def ended(self) -> str:
        """How the command ended, for a message after its command line: see :func:`how_it_ended`."""
        return "ended without an exit status (its SSH channel closed first)" if self.no_exit_status \
            else how_it_ended(self.rc)

    def last_line(self) -> str:
        """The last non-empty line of stderr (else stdout): the usual place for the reason of a failure."""
        for text in (self.stderr, self.stdout):
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            if lines:
                return lines[-1][:300]
        return ""


class Background(Protocol):
    def stop(self) -> CommandResult: ...


class Transport(Protocol):
    def run(self, host: Node, argv: Sequence[str], timeout: float) -> CommandResult: ...

    def start(self, host: Node, argv: Sequence[str], limit: float) -> Background:
        """Start a long-running command (a perftest server); it dies by itself after ``limit`` s."""
        ...


def how_it_ended(rc: int | None) -> str:
    """"exited 3"; a death by signal as "was killed by SIGKILL" (a negative rc: Python's subprocess) or "was
    killed by SIGKILL (exit status 137)" (128 + the number: how a shell reports it, as on the host over SSH);
    None: "did not finish"."""
    if rc is None:
        return "did not finish"
    number = -rc if rc < 0 else rc - 128 if rc > 128 else 0
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"exited {rc}"
    return f"was killed by {name}" if rc < 0 else f"was killed by {name} (exit status {rc})"
