"""What every transport returns and promises: :class:`CommandResult`, the :class:`Transport` and
:class:`Background` protocols, and the per-stream output cap both transports enforce."""

from __future__ import annotations

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

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out and not self.unreachable and not self.truncated

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

