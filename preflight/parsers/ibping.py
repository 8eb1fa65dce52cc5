"""Parser for the client side of ``ibping`` (infiniband-diags / rdma-core).

Usage::

    from preflight.parsers import ibping
    result = ibping.parse(text)
    result.received == result.transmitted        # reachability, no loss
    result.rtt_avg_ms                            # as printed (see the bug below)
    result.rtt_avg_ms_corrected                  # x10

Schema (``IbPing.to_json()``, the contract's ``ibping`` shape plus the permitted corrected keys)::

    {"transmitted": 10, "received": 10, "loss_pct": 0.0, "rtt_min_ms": 0.017, "rtt_avg_ms": 0.020,
     "rtt_max_ms": 0.023, "rtt_min_ms_corrected": 0.17, "rtt_avg_ms_corrected": 0.2,
     "rtt_max_ms_corrected": 0.23}

The RTT bug: since 2019 rdma-core's ibping computes its timestamps as ``tv_sec * 1000000 + tv_nsec /
10000`` (infiniband-diags/ibping.c, ``time_stamp()``), i.e. the sub-second part in units of 10 us while
the result is printed as if it were microseconds. Every RTT below one second is printed 10x too small,
and an RTT that straddles a second boundary is nonsense. So preflight gates *latency* on perftest's
``ib_write_lat`` and uses ibping only for reachability and loss. The printed values stay under the
contract keys (``rtt_*_ms``, "as printed"); ``rtt_*_ms_corrected`` multiply them by ten, which is right
for rdma-core's ibping and wrong for the pre-2019 infiniband-diags package (the parser cannot tell them
apart from the output, another reason not to gate on these numbers).

``loss_pct`` is computed from the two counts rather than read from the ``% packet loss`` token, which
ibping truncates to an integer (1 lost in 1000 prints ``0%``).

Real example (``ibping -c 5 -L 12`` to a ConnectX-7 port, rdma-core 50)::

    Pong from r01n02.(none) (Lid 12): time 0.007 ms
    Pong from r01n02.(none) (Lid 12): time 0.005 ms
    ...

    --- r01n02.(none) (Lid 12) ibping statistics ---
    5 packets transmitted, 5 received, 0% packet loss, time 5004 ms
    rtt min/avg/max = 0.005/0.006/0.007 ms

Output without the statistics block (ibping killed, ``iberror: ... can't resolve destination``) raises
ParseError naming the last line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import Line, ParseError, last_complete, last_nonblank, lines

_PONG = re.compile(r"^\s*Pong from (\S*) \((.+?)\): time ((?:\d+\.?\d*|\.\d+)) ms\s*$")
_STATS_HEADER = re.compile(r"^\s*--- (.*) \((.+?)\) ibping statistics ---\s*$")
_COUNTS = re.compile(
    r"^\s*(\d+) packets transmitted, (\d+) received, (\d+)% packet loss, time (\d+) ms\s*$")
_RTT = re.compile(r"^\s*rtt min/avg/max = ((?:\d+\.?\d*|\.\d+))/((?:\d+\.?\d*|\.\d+))/((?:\d+\.?\d*|\.\d+)) ms\s*$")
RTT_BUG_FACTOR = 10


@dataclass(frozen=True)
class IbPing:
    transmitted: int
    received: int
    loss_pct: float
    rtt_min_ms: float
    rtt_avg_ms: float
    rtt_max_ms: float
    host: str | None = None  # the responder's "hostname.domain" as it answered
    destination: str | None = None  # "Lid 12", as ibping names the port
    time_ms: int | None = None
    pong_ms: tuple[float, ...] = ()  # per-reply times, as printed

    @property
    def rtt_min_ms_corrected(self) -> float:
        return round(self.rtt_min_ms * RTT_BUG_FACTOR, 6)

    @property
    def rtt_avg_ms_corrected(self) -> float:
        return round(self.rtt_avg_ms * RTT_BUG_FACTOR, 6)

    @property
    def rtt_max_ms_corrected(self) -> float:
        return round(self.rtt_max_ms * RTT_BUG_FACTOR, 6)

    def to_json(self) -> dict:
        return {"transmitted": self.transmitted, "received": self.received, "loss_pct": self.loss_pct,
                "rtt_min_ms": self.rtt_min_ms, "rtt_avg_ms": self.rtt_avg_ms, "rtt_max_ms": self.rtt_max_ms,
                "rtt_min_ms_corrected": self.rtt_min_ms_corrected,
                "rtt_avg_ms_corrected": self.rtt_avg_ms_corrected,
                "rtt_max_ms_corrected": self.rtt_max_ms_corrected}


def parse(text: str) -> IbPing:
    # Several pastes: each run ends with its rtt line, so split after those.
    return last_complete(_runs_ending_with_statistics(lines(text)), _parse_run)


def _runs_ending_with_statistics(all_lines: list[Line]) -> list[list[Line]]:
    runs: list[list[Line]] = [[]]
    for line in all_lines:
        runs[-1].append(line)
        if _RTT.match(line.text):
            runs.append([])
    if len(runs) > 1 and not any(line.text.strip() for line in runs[-1]):
        runs.pop()
    return runs


def _parse_run(run: list[Line]) -> IbPing:
    pongs: list[float] = []
    header = counts = rtt = None
    for line in run:
        if match := _PONG.match(line.text):
            pongs.append(float(match.group(3)))
        elif match := _STATS_HEADER.match(line.text):
            header = match
        elif match := _COUNTS.match(line.text):
            counts = match
        elif match := _RTT.match(line.text):
            rtt = match
    if counts is None or rtt is None:
        end = last_nonblank(run)
        what = "no ibping output" if not pongs and header is None else "ibping output ends before its statistics"
        raise ParseError(end.no, end.text, what)
    transmitted, received = int(counts.group(1)), int(counts.group(2))
    loss = round((transmitted - received) * 100.0 / transmitted, 3) if transmitted else 0.0
    return IbPing(
        transmitted=transmitted, received=received, loss_pct=loss,
        rtt_min_ms=float(rtt.group(1)), rtt_avg_ms=float(rtt.group(2)), rtt_max_ms=float(rtt.group(3)),
        host=header.group(1) if header else None, destination=header.group(2) if header else None,
        time_ms=int(counts.group(4)), pong_ms=tuple(pongs),
    )
