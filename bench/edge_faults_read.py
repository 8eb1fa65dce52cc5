"""What bench/edge_faults_virtual.py reads from the edges' ``/metrics`` and its clients' outcomes: the requests
an edge sent to each IU, the edges' counters over a window, and the failure-mode table (fault -> what the
client saw -> what the edge did). Pure functions over recorded samples.

A sample is ``(time, edge, lines)``: the kept lines of one ``/metrics`` answer (:func:`kept_lines`); parsed,
``(time, edge, {(metric, labels): value})``. A counter that drops between two samples of one edge was reset (the
edge restarted): its new value is what it counted since.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from edge_faults import EDGE_RESTART, Fault, Outcome
from prometheus_client.parser import text_string_to_metric_families

INFLIGHT = "eas_edge_inflight"
ERRORS = "eas_edge_upstream_errors_total"
POOL = "eas_edge_pool_ius"  # the edge's view: IUs routable (Consul's checks passing, out of maintenance), scored
COUNTERS = {"retries": ("eas_edge_retries_total", "reason"), "resumed": ("eas_edge_resumed_total", "reason"),
            "ejections": ("eas_edge_ejections_total", "outcome"), "probes": ("eas_edge_probes_total", "outcome"),
            "rejected": ("eas_edge_rejected_total", "reason"), "answers": ("eas_edge_requests_total", "code")}
KEPT = tuple(f"{name}{{" for name in (INFLIGHT, ERRORS, POOL, *(metric for metric, _ in COUNTERS.values())))
# failures of a request before its first byte (edge/upstream.py): each was a request sent to that IU. "stalled"
# is left out: it also names a stream cut mid-way by its silence (not a new request).
BEFORE_FIRST_BYTE = frozenset({"connect", "first_byte", "silent", "ejected", "no_address", "status_5xx"})


def kept_lines(text: str) -> list[str]:
    """The lines of a /metrics answer this module reads."""
    return [line for line in text.splitlines() if line.startswith(KEPT)]


def parse_samples(samples: list[tuple[float, str, list[str]]]) -> list[tuple[float, str, dict]]:
    parsed = []
    for at, edge, lines in samples:
        values = {}
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for sample in family.samples:
                values[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
        parsed.append((at, edge, values))
    return parsed


def _pairs(parsed):
    """Consecutive samples of each edge: (time of the later, earlier values, later values)."""
    last: dict[str, dict] = {}
    for at, edge, values in sorted(parsed, key=lambda s: s[0]):
        if edge in last:
            yield at, last[edge], values
        last[edge] = values


def _rise(before: float | None, after: float) -> float:
    """A counter's increase; a drop is a reset, after which it counted ``after``."""
    before = before or 0.0
    return after - before if after >= before else after


def send_events(parsed) -> list[tuple[float, str]]:
    """(time, IU) for each request an edge was seen sending: a rise of its in-flight count there, or a failure
    there before the first byte (a connection refused is over before the next sample)."""
    events = []
    for at, before, after in _pairs(parsed):
        for (name, labels), value in after.items():
            tags = dict(labels)
            if name == INFLIGHT:
                rise = value - before.get((name, labels), 0.0)
            elif name == ERRORS and tags.get("kind") in BEFORE_FIRST_BYTE:
                rise = _rise(before.get((name, labels)), value)
            else:
                continue
            events += [(at, tags["iu"])] * int(max(0.0, rise))
    return sorted(events)


def counter_deltas(parsed, start: float, end: float) -> dict[str, dict[str, int]]:
    """What every edge counted in (start, end], summed over the edges: {counter: {label value: increase}}."""
    deltas: dict[str, Counter] = defaultdict(Counter)
    for at, before, after in _pairs(parsed):
        if not start < at <= end:
            continue
        for what, (metric, label) in COUNTERS.items():
            for (name, labels), value in after.items():
                if name == metric:
                    rise = _rise(before.get((name, labels)), value)
                    if rise:
                        deltas[what][dict(labels)[label]] += int(rise)
    return {what: dict(sorted(counts.items())) for what, counts in sorted(deltas.items())}


def view_return(parsed, fault: Fault) -> tuple[bool, float | None]:
    """(whether some edge's view lost an IU while ``fault`` lasted, the seconds after it answered again until every
    edge's view had all its IUs routable again; None if not seen). The whole pool is the most any edge saw."""
    routable_key = (POOL, (("kind", "routable"),))
    full = max((values.get(routable_key, 0.0) for _, _, values in parsed), default=0.0)
    lost = any(fault.at <= at < fault.until and values.get(routable_key, full) < full for at, _, values in parsed)
    back: dict[str, float] = {}
    for at, edge, values in sorted(parsed, key=lambda s: s[0]):
        if at >= fault.until and edge not in back and values.get(routable_key, 0.0) >= full:
            back[edge] = at
    edges = {edge for _, edge, _ in parsed}
    return lost, (round(max(back.values()) - fault.until, 2) if back and set(back) == edges else None)


def first_rise(parsed, name: str, labels: tuple, after: float) -> float | None:
    """The first sample after ``after`` at which some edge's counter rose."""
    for at, before, values in _pairs(parsed):
        if at > after and (name, labels) in values and _rise(before.get((name, labels)), values[(name, labels)]):
            return at
    return None


def _add(total: dict, more: dict) -> None:
    for what, counts in more.items():
        for label, n in counts.items():
            total.setdefault(what, {})[label] = total.get(what, {}).get(label, 0) + n


def failure_modes(outcomes: list[Outcome], faults: list[Fault], parsed, settle_s: float) -> dict:
    """Per fault kind: what its clients saw and what the edges did, over all its trials."""
    modes = {}
    for kind in sorted({f.kind for f in faults}):
        of_kind = [f for f in faults if f.kind == kind]
        client = Counter()
        errors = Counter()
        edge: dict = {}
        for fault in of_kind:
            _add(edge, counter_deltas(parsed, fault.at, fault.until + settle_s))
            for o in outcomes:
                if o.ended is None or o.ended <= fault.at or o.started >= fault.until:
                    continue
                first_byte = None if o.ttft is None else o.started + o.ttft
                if kind != EDGE_RESTART and o.iu == fault.iu_id and first_byte is not None and first_byte <= fault.at:
                    where = "on_unit"
                elif first_byte is None or first_byte > fault.at:
                    where = "not_streaming"
                else:
                    where = "elsewhere"
                client[where] += 1
                client[f"{where}_resumed"] += bool(o.ok and o.resumed)
                if not o.ok:
                    client[f"{where}_failed"] += 1
                    errors[f"{where}: {o.error}"] += 1
        views = [view_return(parsed, f) for f in of_kind]
        probes = [first_rise(parsed, COUNTERS["probes"][0], (("outcome", "ok"),), f.until) for f in of_kind]
        modes[kind] = {
            "view_lost": sum(lost for lost, _ in views), "view_back_s": [back for _, back in views],
            "probe_ok_s": [None if t is None else round(t - f.until, 2) for t, f in zip(probes, of_kind, strict=True)],
            "trials": len(of_kind), "client": dict(sorted(client.items())), "errors": dict(sorted(errors.items())),
            "edge": edge, "sends_while_down": sum(len(f.sends) for f in of_kind),
            "last_send_s": round(max((max(f.sends) - f.at for f in of_kind if f.sends), default=0.0), 2),
            "answered_again_s": round(max(f.until - f.at for f in of_kind), 1),
            "back_s": [None if f.back is None else round(f.back - f.until, 2) for f in of_kind],
        }
    return modes


def _span(values: list) -> str:
    seen = [v for v in values if v is not None]
    return f"{min(seen)}-{max(seen)}" if seen else "never seen"


def _counts(counts: dict) -> str:
    return ", ".join(f"{label} {n}" for label, n in counts.items()) or "none"


def failure_table(modes: dict) -> list[str]:
    """The failure-mode table as Markdown: fault -> what the client saw -> what the edge did."""
    lines = ["| fault | trials | what the client saw | what the edge did |", "|---|---:|---|---|"]
    for kind, mode in modes.items():
        c, e = mode["client"], mode["edge"]
        failed = f"failed: {_counts(mode['errors'])}" if mode["errors"] else "none failed"
        if kind == EDGE_RESTART:
            saw = (f"{c.get('not_streaming', 0)} requests not yet streaming while the edge restarted "
                   f"({c.get('not_streaming_failed', 0)} failed), {c.get('elsewhere', 0)} streams flowing "
                   f"({c.get('elsewhere_failed', 0)} failed); {failed}")
            did = (f"back on /healthz {mode['answered_again_s']} s after the restart (the longest); turned away: "
                   f"{_counts(e.get('rejected', {}))}; answers by code: {_counts(e.get('answers', {}))}")
        else:
            done = c.get("on_unit", 0) - c.get("on_unit_failed", 0)
            saw = (f"{c.get('on_unit', 0)} streams flowing from the IU: {done} ended with [DONE] "
                   f"({c.get('on_unit_resumed', 0)} resumed on another IU); {c.get('not_streaming', 0)} requests not "
                   f"yet streaming ({c.get('not_streaming_failed', 0)} failed); {failed}")
            backs = [b for b in mode["back_s"] if b is not None]
            did = (f"moved before the first byte: {_counts(e.get('retries', {}))}; resumed: "
                   f"{_counts(e.get('resumed', {}))}; ejected: {_counts(e.get('ejections', {}))}; probes: "
                   f"{_counts(e.get('probes', {}))}; {mode['sends_while_down']} requests sent to the IU while it was "
                   f"down, the last {mode['last_send_s']} s after the fault; answering again after up to "
                   f"{mode['answered_again_s']} s, its first request "
                   + (f"{min(backs)}-{max(backs)} s later" if backs else "never seen")
                   + (f" ({len(mode['back_s']) - len(backs)} trials: none seen)" if backs and None in mode["back_s"]
                      else "")
                   + f"; the edges' view lost it in {mode['view_lost']} of {mode['trials']} trials, every edge "
                     f"routing to it again {_span(mode['view_back_s'])} s after it answered; the first good probe "
                     f"{_span(mode['probe_ok_s'])} s after")
        lines.append(f"| {kind} | {mode['trials']} | {saw} | {did} |")
    return lines
