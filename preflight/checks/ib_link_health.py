"""ib_link_health: HCA port error counters around the pair tests, link flaps in the kernel log, optional BER.

A bracket check. ``gather`` (with the node checks, before ib_pairs runs) reads, in one ``grep -H``, the
sysfs counters ``link_downed``, ``symbol_error``, ``port_rcv_errors`` and ``link_error_recovery`` of each
inventory port; ``finish`` (after the rack checks) reads them again, the kernel log of the flap window
(``journalctl -k -o short-iso``; the parser also reads BSD-syslog stamps, as pasted from
/var/log/syslog on older hosts) and the host's clock (``date +%s``, kind ``date-epoch``), and with ``ib_health.mlxlink`` ``mlxlink -d <dev>
-c`` per HCA.

Judgement (``evaluate``, pure): counters grown by more than the profile's ``*_max`` -> FAIL
``IB_COUNTER``; more than ``flap_max`` link-down events of one inventory netdev within
``flap_window_hours`` of the host's now -> FAIL ``IB_LINK_FLAP``; mlxlink effective (post-FEC) BER above
``effective_ber_max`` -> FAIL ``IB_BER``. The log names interfaces: an inventory NIC without ``netdev``
while the window holds link-down events of interfaces no NIC names -> WARN ``IB_FLAPS_UNVERIFIED``
(they may be its flaps). A journal that was not read whole (journalctl's stderr says the user cannot
see the system's messages, or that there is no journal: ``kernel_log.journal_gap``) is an ERROR, never
zero flaps: preflight runs its commands as the inventory's ``ansible_user``, without sudo.

Fault codes: IB_COUNTER, IB_LINK_FLAP, IB_BER, IB_FLAPS_UNVERIFIED, NO_NICS, IB_HEALTH_OK.
"""

from __future__ import annotations

from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, GatherError, NodeContext, command_line, excerpt
from preflight.parsers.ib_health import LinkEvents, MlxlinkBer, counter_values, parse_kernel_links
from preflight.parsers.kernel_log import journal_gap
from preflight.result import CheckResult, Verdict

COUNTERS = {"link_downed": "link_downed_max", "symbol_error": "symbol_error_max",
            "port_rcv_errors": "port_rcv_errors_max", "link_error_recovery": "link_error_recovery_max"}
NOW = ["date", "+%s"]


def counter_path(device: str, port: int, counter: str) -> str:
    return f"/sys/class/infiniband/{device}/ports/{port}/counters/{counter}"


def journal_argv(window_hours: float) -> list[str]:
    return ["journalctl", "-k", "-o", "short-iso", "--no-pager", "--since", f"{max(1, round(window_hours * 60))} min ago"]


class IbLinkHealth(Check):
    name = "ib_link_health"
    scope = "bracket"
    codes = {
        "IB_COUNTER": "a port error counter grew past the profile's limit while preflight ran",
        "IB_LINK_FLAP": "a port went down more often than the profile allows within the flap window",
        "IB_BER": "mlxlink effective BER above the profile's limit",
        "NO_NICS": "inventory lists no rdma_nics",
        "IB_FLAPS_UNVERIFIED": "a NIC without a netdev in the inventory, and link-down events of interfaces no "
                               "inventory NIC names: its flaps cannot be counted (WARN)",
    }

    def _counters(self, ctx: NodeContext) -> dict[str, int | None]:
        paths = [counter_path(n.device, n.port, c) for n in ctx.node.nics for c in COUNTERS]
        return counter_values(ctx.parsed("sysfs", ["grep", "-H", ".", *paths], cache=False))

    def gather(self, ctx: NodeContext) -> dict[str, int | None] | None:
        return self._counters(ctx) if ctx.node.nics else None

    def finish(self, ctx: NodeContext, before: Any) -> list[CheckResult]:
        node = ctx.node
        if not node.nics:
            return [self.result(node, Verdict.SKIP, "NO_NICS", "inventory lists no rdma_nics")]
        if isinstance(before, GatherError):
            return [self.error(node, before)]
        cfg = ctx.profile["ib_health"]
        try:
            after = self._counters(ctx)
            now = float(ctx.parsed("date-epoch", NOW, cache=False).seconds)
            argv = journal_argv(cfg["flap_window_hours"])
            journal = ctx.completed(argv)
            text = journal.stdout
            if gap := journal_gap(journal.stderr):
                # `-- No entries --` from a journal the SSH user cannot read is no evidence of zero flaps
                raise GatherError(f"`{command_line(argv)}` did not read the kernel's messages: {gap} (the "
                                  "connecting user needs the systemd-journal or adm group)",
                                  command=command_line(argv), stderr=excerpt(journal.stderr))
            try:
                events = parse_kernel_links(text, now=now)
            except ValueError as exc:  # ParseError: unreadable log is an ERROR, never zero flaps
                raise GatherError(f"cannot parse `{' '.join(argv)}` output: {exc}", output=text[:400]) from None
            ber = {nic.device: ctx.parsed("mlxlink", ["mlxlink", "-d", nic.device, "-c"])
                   for nic in node.nics} if cfg["mlxlink"] else {}
        except GatherError as exc:
            return [self.error(node, exc)]
        return self.evaluate({"before": before, "after": after, "events": events, "now": now, "ber": ber},
                             ctx.profile, node)

    def evaluate(self, facts: dict[str, Any], profile: dict[str, Any], node: Node) -> list[CheckResult]:
        cfg = profile["ib_health"]
        before: dict[str, int | None] = facts["before"]  # counter path -> value
        after: dict[str, int | None] = facts["after"]
        events: LinkEvents = facts["events"]
        ber: dict[str, MlxlinkBer] = facts["ber"]
        problems: list[tuple[Verdict, str, str]] = []
        grown: dict[str, dict[str, int]] = {}
        for nic in node.nics:
            port = f"{nic.device}:{nic.port}"
            for counter, limit_key in COUNTERS.items():
                path = counter_path(nic.device, nic.port, counter)
                start, end = before.get(path), after.get(path)
                if start is None or end is None:
                    problems.append((Verdict.FAIL, "IB_COUNTER", f"{port}: {counter} not readable ({path})"))
                    continue
                delta = end - start
                if delta:
                    grown.setdefault(port, {})[counter] = delta
                if delta > cfg[limit_key]:
                    problems.append((Verdict.FAIL, "IB_COUNTER", f"{port}: {counter} +{delta} during the run "
                                                                 f"(limit {cfg[limit_key]:g})"))
        window_start = facts["now"] - cfg["flap_window_hours"] * 3600
        netdevs = {nic.netdev: f"{nic.device}:{nic.port}" for nic in node.nics if nic.netdev}
        flaps: dict[str, int] = {}
        unclaimed: dict[str, int] = {}  # link-down events of interfaces no inventory NIC names
        for event in events.events:
            if event.state == "down" and window_start <= event.epoch <= facts["now"] + 60:
                counts = flaps if event.device in netdevs else unclaimed
                counts[event.device] = counts.get(event.device, 0) + 1
        for netdev, count in flaps.items():
            if count > cfg["flap_max"]:
                problems.append((Verdict.FAIL, "IB_LINK_FLAP", f"{netdevs[netdev]} ({netdev}) went down {count} times "
                                                               f"in {cfg['flap_window_hours']:g} h"))
        unnamed = [f"{nic.device}:{nic.port}" for nic in node.nics if not nic.netdev]
        if unnamed and unclaimed:
            # The log names interfaces, and these NICs have none in the inventory: the events may be theirs.
            seen = ", ".join(f"{dev} x{n}" for dev, n in sorted(unclaimed.items()))
            problems.append((Verdict.WARN, "IB_FLAPS_UNVERIFIED",
                             f"{', '.join(unnamed)}: no netdev in the inventory, so link-down events in "
                             f"{cfg['flap_window_hours']:g} h ({seen}) cannot be counted against "
                             f"{'it' if len(unnamed) == 1 else 'them'} (set rdma_nics netdev)"))
        for device, reading in ber.items():
            if reading.effective_ber is not None and reading.effective_ber > cfg["effective_ber_max"]:
                problems.append((Verdict.FAIL, "IB_BER", f"{device}: effective BER {reading.effective_ber:.1e} > "
                                                         f"{cfg['effective_ber_max']:.0e}"))
        ok = (f"{len(node.nics)} ports: no counter growth past limits, {sum(flaps.values())} link-down events "
              f"in {cfg['flap_window_hours']:g} h")
        return [self.outcome(node, problems, "IB_HEALTH_OK", ok,
                             expected={k: cfg[k] for k in (*COUNTERS.values(), "flap_max", "flap_window_hours")},
                             found={"counters_grown": grown, "flaps": flaps, "unclaimed_flaps": unclaimed,
                                    "log_lines": events.lines_read,
                                    "effective_ber": {d: r.effective_ber for d, r in ber.items()}})]


CHECK = IbLinkHealth()
