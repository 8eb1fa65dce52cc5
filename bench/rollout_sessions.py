"""Conversations under a traffic rollout: do the turns of one session flip-flop between the stable and the
canary revision? A dev Consul, two stable and two canary simulated IUs, three real ``eas-edge`` processes
(debug logs kept), and conversations of several turns, each turn sent through the next edge, so the edges
must agree with each other.

Phases: the rollout document at 5%, 20% and 50% (one session salt, as ``clusterctl rollout start`` writes
it), then aborted; at each weight every session sends ``--turns`` turns, after the abort one. Modes, over the
same conversations:

- ``none``: no session key: each request is drawn by the edge's credit counter (the baseline);
- ``header``: an ``X-Session-Id`` header; every eighth key carries bytes that are not UTF-8 and one is 7,000
  characters long;
- ``user``: the body's OpenAI ``user`` field;
- ``retry-counter`` and ``retry``: retries without a session key: each "session" is one request sent ``--turns``
  times with the same body and credential (``Authorization: Bearer <key>``), ``x-stainless-retry-count``
  0, 1, ... as the OpenAI Python SDK sends it, each attempt through the next edge; ``retry-counter`` on edges
  with ``rollout_request_key: never`` (the credit counter: the baseline), ``retry`` on the default edges (the
  request's own key).

Measured per mode, from the IU that answered each turn (``X-Eas-IU``):

- flip-flop: the share of (session, weight) pairs whose turns landed on both revisions, and the share of
  consecutive turns of a session at one weight that changed revision;
- moved back: sessions with a turn on the canary at one weight and a turn on stable at a higher one;
- the canary's share at each weight: of sessions in the keyed modes and of requests in ``retry`` (tolerance
  4 * sqrt(w (1 - w) / n) over n), of requests in ``none`` and ``retry-counter`` (the counter: within one
  request per edge);
- after the abort: turns answered by the canary;
- keys in the logs: session keys found in the edges' debug logs.

Target (keyed modes): no flip-flop, no session moved back, every share within its tolerance, no turn on the
canary after the abort, no key in the logs. ``retry``: no request whose attempts met both revisions, every
share within its tolerance, nothing on the canary after the abort, no credential in the logs (moved back is
no target: each weight sends other requests). The ``none`` and ``retry-counter`` rows are baselines.

Everything listens on 127.0.73.N (``--net`` names another 127.0.R)::

    .venv/bin/python bench/rollout_sessions.py
    .venv/bin/python bench/rollout_sessions.py --conversations 240 --turns 4 --results
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results  # noqa: E402
from bench.edge_procs import start_edge  # noqa: E402
from bench.rollout_canary import body_of  # noqa: E402
from consul_io import layout  # noqa: E402
from consul_io.client import ConsulIO  # noqa: E402
from devconsul.server import DevConsulServer  # noqa: E402
from eas_wire.rollout import RolloutDoc  # noqa: E402
from sim.vllm.openai_api import MODEL_NAME  # noqa: E402
from sim.vllm.registration import IUService, register_on_catalog_node  # noqa: E402
from sim.vllm.server import SimulatedIU  # noqa: E402

NET = "127.0.73"
DC = layout.DEFAULT_DATACENTER
STABLE, CANARY = "vllm-0.6+sim", "vllm-0.7+sim"
WEIGHTS = (0.05, 0.2, 0.5)
MODES = ("none", "header", "user", "retry-counter", "retry")
RETRY_MODES = ("retry-counter", "retry")
BASELINES = ("none", "retry-counter")
EDGES = 3
CLIENTS = 12


def session_keys(n: int) -> list[str]:
    """Distinct keys a log search can find; every eighth with bytes that are not UTF-8 on the wire (urllib
    sends a header's text as Latin-1), the last 7,000 characters long (aiohttp's header line cap is 8 KiB)."""
    run = secrets.token_hex(6)
    keys = [f"sess-{run}-{k:04d}" + ("\xff\xfe" if k % 8 == 7 else "") for k in range(n)]
    keys[-1] = keys[-1] + "z" * 7000
    return keys


def turn(edge: str, mode: str, key: str, text: str, attempt: int = 0) -> str | None:
    """One turn through ``edge`` (in the retry modes: attempt ``attempt`` of one request, ``key`` its client's
    API key); the IU that answered (None: no answer)."""
    body = {"model": MODEL_NAME, "prompt": text, "max_tokens": 2, **({"user": key} if mode == "user" else {})}
    headers = {"Content-Type": "application/json", **({"X-Session-Id": key} if mode == "header" else {}),
               **({"Authorization": f"Bearer {key}", "x-stainless-retry-count": str(attempt)}
                  if mode in RETRY_MODES else {})}
    request = urllib.request.Request(f"http://{edge}/v1/completions", data=json.dumps(body).encode(),
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
            return answer.headers.get("X-Eas-IU")
    except (urllib.error.HTTPError, OSError):
        return None


def conversations(edges: list[str], mode: str, keys: list[str], turns: int, phase: str) -> dict[int, list]:
    """Every session's ``turns`` turns in order (sessions side by side on ``CLIENTS`` threads), turn t of
    session s through edge (s + t) mod E: {session: [IU per turn]}."""
    def session(s: int) -> list:
        return [turn(edges[(s + t) % len(edges)], mode, keys[s],
                     f"session {s} {phase}" + ("" if mode in RETRY_MODES else f" turn {t}"), t)
                for t in range(turns)]

    with ThreadPoolExecutor(CLIENTS) as pool:
        return dict(enumerate(pool.map(session, range(len(keys)))))


def metric(admin: str, name: str) -> float:
    """The sum of ``name``'s samples in an edge's /metrics (NaN when it did not answer)."""
    try:
        with urllib.request.urlopen(f"http://{admin}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return math.nan
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def put_doc(io: ConsulIO, admins: list[str], weight: float, state: str, salt: str) -> None:
    doc = RolloutDoc("sessions", STABLE, CANARY, weight, state, 0, time.time(), session_salt=salt)
    io.kv_put(layout.rollout_key(DC), doc.dumps())
    deadline = time.monotonic() + 10
    while any(metric(a, "eas_edge_rollout_weight ") != doc.effective_weight for a in admins):
        if time.monotonic() > deadline:
            raise SystemExit(f"rollout_sessions: the edges did not apply weight {doc.effective_weight}")
        time.sleep(0.02)


def run_mode(mode: str, sessions: int, turns: int, net: str = NET) -> dict:
    """One mode on a fresh cluster: the phases, then the measures (see the module docstring)."""
    keys, salt = session_keys(sessions), secrets.token_hex(16)
    with DevConsulServer(addr=f"{net}.1:0") as server, tempfile.TemporaryDirectory() as tmp:
        io, sims, revision_of = ConsulIO(server.address), [], {}
        for n, revision in enumerate((STABLE, STABLE, CANARY, CANARY)):
            node, address = f"n{n}", f"{net}.{11 + n}"
            sim = SimulatedIU(address, 0, arrival_rate=0, seed=n).start()
            register_on_catalog_node(io, IUService(f"{node}-iu0", node, "r1", address,
                                                   int(sim.address.rsplit(":", 1)[1]), (0,), 0, revision=revision),
                                     address)
            io.kv_put(layout.score_key(DC, node), body_of(node, [f"{node}-iu0"]))
            sims.append(sim)
            revision_of[f"{node}-iu0"] = revision
        config = Path(tmp) / "edge.yml"
        config.write_text("debug_headers: true\n" + ("rollout_request_key: never\n" if mode == "retry-counter" else ""))
        logs = [Path(tmp) / f"edge{k}.log" for k in range(EDGES)]
        edges = []
        try:
            for k, log in enumerate(logs):
                with log.open("w") as stderr:
                    edges.append(start_edge(server.address, [
                        "--config", str(config), "--listen", f"{net}.{2 + k}:0", "--admin-listen", f"{net}.{2 + k}:0",
                        "--no-push", "--log-level", "debug"], stderr=stderr))
            clients, admins = [a for _, a in edges], [p.admin_address for p, _ in edges]
            phases = {}
            for weight in WEIGHTS:
                put_doc(io, admins, weight, "progressing", salt)
                phases[weight] = conversations(clients, mode, keys, turns, f"w{weight}")
            put_doc(io, admins, 0.0, "aborted", salt)
            aborted = conversations(clients, mode, keys, 1, "aborted")
            fallbacks = sum(metric(a, "eas_edge_rollout_fallbacks_total") for a in admins)
        finally:
            for process, _ in edges:
                process.terminate()
                process.wait(10)
            for sim in sims:
                sim.stop()
        log_text = b"".join(log.read_bytes() for log in logs)
    in_logs = sum(1 for key in keys if key.encode("latin-1")[:40] in log_text or key.encode()[:40] in log_text)
    row = measure(mode, phases, aborted, revision_of, sessions)
    row.update({"turns": turns, "fallbacks": int(fallbacks), "keys_in_logs": in_logs,
                "log_lines": log_text.count(b"\n")})
    row["met"] = None if mode in BASELINES else (
        row["flip_flop"] == 0 and (row["moved_back"] == 0 or mode == "retry") and all(row["share_ok"].values())
        and row["canary_after_abort"] == 0 and in_logs == 0 and row["unanswered"] == 0)
    return row


def measure(mode: str, phases: dict, aborted: dict, revision_of: dict, sessions: int) -> dict:
    sides = {w: {s: [revision_of.get(iu) == CANARY for iu in ius if iu is not None] for s, ius in by_session.items()}
             for w, by_session in phases.items()}
    pairs = [(w, s) for w in sides for s in sides[w] if sides[w][s]]
    flipped = sum(1 for w, s in pairs if len(set(sides[w][s])) > 1)
    changes = sum(a != b for w, s in pairs for a, b in zip(sides[w][s], sides[w][s][1:], strict=False))
    steps = sum(max(0, len(sides[w][s]) - 1) for w, s in pairs)
    on_canary = {w: {s for s, turns in sides[w].items() if turns and all(turns)} for w in sides}
    weights = sorted(sides)
    # a turn on the canary at one weight, a turn on stable at a higher one
    moved_back = len({s for lower, higher in zip(weights, weights[1:], strict=False) for s in sides[lower]
                      if any(sides[lower][s]) and not all(sides[higher][s])})
    share, share_ok = {}, {}
    for w in weights:
        if mode in BASELINES:  # requests: the counter is exact within one request per edge
            flat = [c for turns in sides[w].values() for c in turns]
            share[w] = sum(flat) / max(1, len(flat))
            share_ok[w] = abs(sum(flat) - w * len(flat)) <= EDGES
        else:
            share[w] = len(on_canary[w]) / sessions
            share_ok[w] = abs(share[w] - w) <= 4 * math.sqrt(w * (1 - w) / sessions)
    answered = [iu for by_session in (*phases.values(), aborted) for ius in by_session.values() for iu in ius]
    return {"mode": mode, "sessions": sessions, "requests": len(answered),
            "unanswered": sum(iu is None for iu in answered),
            "flip_flop": round(flipped / max(1, len(pairs)), 4), "turn_changes": round(changes / max(1, steps), 4),
            "moved_back": moved_back, "share": {str(w): round(v, 4) for w, v in share.items()},
            "share_ok": {str(w): ok for w, ok in share_ok.items()},
            "canary_after_abort": sum(revision_of.get(iu) == CANARY for ius in aborted.values() for iu in ius)}


def table(rows: list[dict]) -> str:
    lines = ["| session key | sessions x turns | flip-flop (sessions x weights on both revisions) | turns that "
             "changed revision | moved back to stable | canary share at 5 / 20 / 50% | on the canary after abort | "
             "keys in logs | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shares = " / ".join(f"{v:.3f}" + ("" if r["share_ok"][w] else " (out)") for w, v in r["share"].items())
        verdict = "baseline (no target)" if r["met"] is None else "met" if r["met"] else "NOT met"
        lines.append(f"| {r['mode']} | {r['sessions']} x {r['turns']} | {r['flip_flop']:.3f} | {r['turn_changes']:.3f} "
                     f"| {r['moved_back']} | {shares} | {r['canary_after_abort']} | {r['keys_in_logs']} of "
                     f"{r['sessions']} ({r['log_lines']} log lines) | {verdict} |")
    return "\n".join(lines)


TARGET = ("with a session key (X-Session-Id or user): no session on both revisions at one weight, none moved back "
          "to stable as the weight rose, the canary's share of sessions within 4 sigma of the weight, nothing on the "
          "canary after abort, no key in the edges' debug logs; retries without a session key: every attempt of a "
          "request on one revision, the canary's share of requests within 4 sigma, no credential in the logs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=120, help="sessions per mode (default 120)")
    parser.add_argument("--turns", type=int, default=3, help="turns of each conversation at each weight (default 3)")
    parser.add_argument("--net", default=NET, help=f"the loopback 127.0.R every listener takes (default {NET})")
    results.add_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.conversations < 8 or args.turns < 2:
        parser.error("--conversations must be at least 8 and --turns at least 2")
    load = results.load_at_start()
    rows = [run_mode(mode, args.conversations, args.turns, args.net) for mode in MODES]
    print(table(rows))
    keyed = [r for r in rows if r["met"] is not None]
    met = all(r["met"] for r in keyed)
    print(f"target: {TARGET}: {'met' if met else 'NOT met'}")
    numbers = {f"{r['mode']}_{key}": r[key] for r in rows
               for key in ("flip_flop", "turn_changes", "moved_back", "canary_after_abort", "keys_in_logs",
                           "requests", "fallbacks")}
    numbers.update({f"{r['mode']}_share_{w}": v for r in rows for w, v in r["share"].items()})
    summary = "; ".join(f"{r['mode']}: flip-flop {r['flip_flop']:.3f}, turns changed {r['turn_changes']:.3f}, moved "
                        f"back {r['moved_back']}, after abort {r['canary_after_abort']}" for r in rows)
    return results.record_met(args.results, met, script=__file__, argv=argv, numbers=numbers, host=load,
                              target=TARGET, summary=summary)


if __name__ == "__main__":
    results.exit_with(main, __file__)
