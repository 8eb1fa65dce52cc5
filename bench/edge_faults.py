"""What clients see when an IU's engine is killed or stalled under load, against the edge's fault targets.

A local pool: ``--units`` simulated vLLM IUs, each its own process (``python -m sim.vllm``) on its own
loopback address (``--loopback``: the dev Consul on .1, the edge on .2, IU n on .(11 + n)), so
one can be killed (SIGKILL) or stalled (SIGSTOP, then SIGCONT); a dev Consul; the edge (edge.main.Edge) on a
thread of this process, its router's sends recorded; streamed completions at ``--load`` (mean streams in
flight per IU = load x 8, the rate calibrated from a first stream's duration; the edge's per-IU cap is its
default 64, so its queue never binds). No agents: the edge routes fail-open (least in flight), so what is measured is
the edge's own failure handling, not the agents' scores vanishing.

Each trial: a quiet baseline, then the fault on a random IU (killed and restarted ``--kill-s`` later, or
stalled for ``--stall-s``, longer than the client's ``--client-idle-s`` read timeout), then a settle time.
Per fault kind, over ``--repeats`` trials:

- client-visible failures, split into requests not yet streaming (no data event) and streams cut
  (an error event, no ``[DONE]``, a read timeout);
- the longest silence inside a stream that was in flight during a fault;
- the time from the fault to the last new request the edge sent to the faulted IU while it was down;
- p99 TTFT of requests sent during the fault (and 2 s after) vs the baseline windows.

    .venv/bin/python bench/edge_faults.py --repeats 5 --results

bench/edge_faults_virtual.py runs the same load (:func:`drive`), attribution and verdicts on the virtual cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace

import aiohttp
import results
from edge_procs import ROOT, DevConsul

from consul_io.client import ConsulIO
from edge.config import AccessConfig, EdgeConfig, PushConfig
from edge.main import Edge
from sim.vllm.registration import IUService, register_on_catalog_node

MODEL = "meta-llama/Meta-Llama-3-70B-Instruct"
SLOTS = 8  # streams in flight per IU at --load 1.0
LOOPBACK = "127.0.61"  # the first three octets of the bench's addresses (--loopback)
TARGET_SILENCE_S, TARGET_KILLED_S, TARGET_STALLED_S, TARGET_TTFT_RATIO = 5.0, 2.0, 5.0, 1.15
TARGET_BACK_S = 5.0  # a restarted IU's first request after it answers again
EDGE_RESTART = "edge_restart"  # a fault kind of the virtual cluster's bench (edge_faults_virtual.py)


class Unit:
    """One simulated vLLM IU in a process of its own."""

    def __init__(self, iu_id: str, io: ConsulIO, host: str):
        self.iu_id, self.host, self.port, self.process = iu_id, host, None, None
        self.start()
        # on a catalog node of its own, as its node agent would sync it (one Consul stands in for every node)
        register_on_catalog_node(io, IUService(iu_id, iu_id.split("-")[0], "r1", host, self.port, (0,), 0), host)

    def start(self) -> None:
        port = self.port or 0
        self.process = subprocess.Popen([sys.executable, "-m", "sim.vllm", "--iu", f"{self.host}:{port}:0",
                                         "--warmup-s", "0"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        line = self.process.stdout.readline()  # its metrics URL: the server listens
        self.port = int(line.split(f"{self.host}:", 1)[1].split("/", 1)[0])

    def signal(self, sig: int) -> None:
        os.kill(self.process.pid, sig)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.process.terminate()
        self.process.wait(10)


@dataclass
class Outcome:
    started: float
    ttft: float | None = None
    ended: float | None = None
    streamed: bool = False  # a data event reached the client
    ok: bool = False
    gap: float = 0.0  # the longest silence between events after the first
    last: float = 0.0
    error: str = ""
    iu: str = ""  # the IU that sent its first byte (X-Eas-IU: an edge with debug_headers on)
    resumed: int = 0  # the edge's splice comments (": resumed ..."): the stream went on on another IU


@dataclass
class Fault:
    kind: str
    iu_id: str
    at: float
    until: float  # the IU answers again (SIGCONT sent, or restarted)
    quiet_until: float  # the restart began: its CPU (on this host, not the IU's machine) is left out of TTFT
    sends: list = field(default_factory=list)  # times the edge sent a request to it while down
    back: float | None = None  # the edge's first request to it after ``until``


async def one_stream(session: aiohttp.ClientSession, url: str, idle_s: float, out: Outcome,
                     model: str = MODEL) -> None:
    body = {"model": model, "prompt": "hello " * 50, "max_tokens": 60, "stream": True}
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(sock_read=idle_s)) as answer:
            out.iu = answer.headers.get("X-Eas-IU", "")
            if answer.status != 200:
                out.error = f"HTTP {answer.status}"
                return
            done = False
            async for line in answer.content:
                now = time.monotonic()
                if line.startswith(b": resumed"):
                    out.resumed += 1
                if not line.startswith(b"data:") and not line.startswith(b"event:"):
                    continue
                if line.startswith(b"event: error"):
                    out.error = "SSE error event"
                    return
                if out.ttft is None:
                    out.ttft, out.last, out.streamed = now - out.started, now, True
                out.gap, out.last = max(out.gap, now - out.last), now
                done = done or line.strip() == b"data: [DONE]"
            out.ok = done
            out.error = "" if done else "stream ended without [DONE]"
    except (TimeoutError, aiohttp.ClientError) as exc:
        out.error = type(exc).__name__
    finally:
        out.ended = time.monotonic()


def run(units: int = 4, load: float = 0.5, repeats: int = 5, baseline_s: float = 4.0, stall_s: float = 8.0,
        kill_s: float = 5.0, settle_s: float = 4.0, client_idle_s: float = 6.0, kinds=("kill", "stall"),
        seed: int = 1, loopback: str = LOOPBACK) -> dict:
    rng = random.Random(seed)
    with DevConsul(f"{loopback}.1") as consul:
        io = ConsulIO(consul.address)
        pool = [Unit(f"u{n}-iu0", io, f"{loopback}.{11 + n}") for n in range(units)]
        config = EdgeConfig(listen=f"{loopback}.2:0", consul=replace(EdgeConfig().consul, address=consul.address),
                            push=PushConfig(enabled=False), seed=seed,
                            access=AccessConfig(admin_listen=f"{loopback}.2:0"))
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        edge = Edge(config)
        address = asyncio.run_coroutine_threadsafe(edge.start(), loop).result(30)
        sends: list[tuple[float, str]] = []
        router = edge.state.router
        original_sent = router.sent

        def sent(iu_id, now, *args, **kwargs):
            sends.append((time.monotonic(), iu_id))
            return original_sent(iu_id, now, *args, **kwargs)

        router.sent = sent
        try:
            waited = time.monotonic() + 30
            while len(edge.state.view.snapshot().healthy) < units:
                if time.monotonic() > waited:
                    raise SystemExit(f"the edge sees {len(edge.state.view.snapshot().healthy)} of {units} IUs")
                time.sleep(0.05)
            routable = {unit.iu_id: _routable(router, unit.iu_id) for unit in pool}
            outcomes, faults, rate, duration = asyncio.run(_drive(
                f"http://{address}/v1/completions", pool, load, repeats, baseline_s, stall_s, kill_s, settle_s,
                client_idle_s, kinds, rng, routable))
            registry = edge.state.metrics.registry
            counted = {name: {sample.labels["reason"]: sample.value for metric in registry.collect()
                              if metric.name == name for sample in metric.samples if sample.name.endswith("_total")}
                       for name in ("eas_edge_resumed", "eas_edge_retries")}
        finally:
            asyncio.run_coroutine_threadsafe(edge.close(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            for unit in pool:
                unit.stop()
    attribute_sends(faults, sends)
    numbers = summarise(outcomes, faults, baseline_s, rate, duration)
    numbers["streams_resumed"], numbers["requests_moved"] = counted["eas_edge_resumed"], counted["eas_edge_retries"]
    return numbers


def attribute_sends(faults: list[Fault], sends: list[tuple[float, str]]) -> None:
    """Each fault's sends to its IU while it was down, and the first one after it answered again."""
    for fault in faults:
        fault.sends = [t for t, iu in sends if iu == fault.iu_id and fault.at <= t < fault.until]
        fault.back = next((t for t, iu in sorted(sends) if iu == fault.iu_id and t >= fault.until), None)


def _routable(router, iu_id: str):
    """Whether the edge has ``iu_id`` back in rotation (read from another thread: a snapshot of dicts)."""
    return lambda: iu_id not in dict(router.outliers.ejected) and iu_id not in dict(router.outliers.records)


async def drive(url: str, units: int, load: float, idle_s: float, rng: random.Random, trials, *,
                model: str = MODEL):
    """Streamed completions to ``url`` at ``load`` (mean streams in flight per IU = load x SLOTS, the rate from
    one first stream's duration), open loop, while ``trials(rate)`` (a coroutine function) injects the
    faults and returns them; then the streams still in flight are given ``3 x idle_s`` to end.
    (outcomes, faults, rate, one stream's duration)."""
    outcomes: list[Outcome] = []
    tasks: set = set()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        probe = Outcome(time.monotonic())
        await one_stream(session, url, idle_s, probe, model)
        if not probe.ok:
            raise SystemExit(f"the first stream to {url} failed: {probe.error}")
        duration = max(0.2, (probe.ended or time.monotonic()) - probe.started)
        rate = load * SLOTS * units / duration
        stop = asyncio.Event()

        async def arrivals():
            while not stop.is_set():
                out = Outcome(time.monotonic())
                outcomes.append(out)
                task = asyncio.create_task(one_stream(session, url, idle_s, out, model))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(rng.expovariate(rate))

        generator = asyncio.create_task(arrivals())
        try:
            faults = await trials(rate)
        finally:
            stop.set()
            await generator
            if tasks:
                await asyncio.wait(tasks, timeout=idle_s * 3)
    return outcomes, faults, rate, duration


async def _drive(url, pool, load, repeats, baseline_s, stall_s, kill_s, settle_s, idle_s, kinds, rng, routable):
    async def trials(_rate) -> list[Fault]:
        faults: list[Fault] = []
        for kind in [k for k in kinds for _ in range(repeats)]:
            await asyncio.sleep(baseline_s)
            unit = rng.choice(pool)
            at = time.monotonic()
            if kind == "kill":
                unit.signal(signal.SIGKILL)
                unit.process.wait()
                await asyncio.sleep(kill_s)
                quiet_until = time.monotonic()
                await asyncio.to_thread(unit.start)
            else:
                unit.signal(signal.SIGSTOP)
                await asyncio.sleep(stall_s)
                quiet_until = time.monotonic()
                unit.signal(signal.SIGCONT)
            faults.append(Fault(kind, unit.iu_id, at, time.monotonic(), quiet_until))
            await asyncio.sleep(settle_s)
            for _ in range(200):  # the next trial starts with the whole pool in rotation
                if all(check() for check in routable.values()):
                    break
                await asyncio.sleep(0.1)
        return faults

    return await drive(url, len(pool), load, idle_s, rng, trials)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarise(outcomes: list[Outcome], faults: list[Fault], baseline_s: float, rate: float, duration: float
              ) -> dict:
    done = [o for o in outcomes if o.ended is not None]
    numbers = {"requests": len(done), "rate_per_s": round(rate, 1), "stream_s": round(duration, 2), "kinds": {}}

    def during(o: Outcome, fault: Fault) -> bool:
        return o.started < fault.until + 2.0 and (o.ended or 0) > fault.at

    # the quiet window before each fault, whole pool in rotation (not the recoveries, not a restart's CPU)
    baseline = [o.ttft for o in done if o.ttft is not None
                and any(f.at - baseline_s <= o.started and o.ended < f.at for f in faults)]
    base_p99 = percentile(baseline, 0.99)
    for kind in sorted({f.kind for f in faults}):
        of_kind = [f for f in faults if f.kind == kind]
        touched = [o for o in done if any(during(o, f) for f in of_kind)]
        failed = [o for o in touched if not o.ok]
        in_fault = [o.ttft for o in touched if o.ttft is not None and any(f.at <= o.started < f.quiet_until
                                                                           for f in of_kind)]
        last_send = max((max(f.sends) - f.at if f.sends else 0.0) for f in of_kind)
        backs = [f.back - f.until for f in of_kind if f.back is not None]
        fault_p99 = percentile(in_fault, 0.99)
        numbers["kinds"][kind] = {
            "trials": len(of_kind),
            "requests_during": len(touched),
            "failed_not_streaming": sum(1 for o in failed if not o.streamed),
            "failed_streaming": sum(1 for o in failed if o.streamed),
            "errors": sorted({o.error for o in failed}),
            "longest_silence_s": round(max((o.gap for o in touched), default=0.0), 2),
            "last_send_after_fault_s": round(last_send, 2),
            "sends_while_down": sum(len(f.sends) for f in of_kind),
            "back_in_rotation_s": round(max(backs), 2) if backs else None,
            "p99_ttft_s": fault_p99 and round(fault_p99, 3),
            "baseline_p99_ttft_s": base_p99 and round(base_p99, 3),
            "ttft_ratio": round(fault_p99 / base_p99, 2) if fault_p99 and base_p99 else None,
        }
    return numbers


def verdict_lines(numbers: dict, restarted_back: bool = False) -> tuple[list[str], bool]:
    """One line per target and fault kind, each ending "met" or "NOT met", and whether all are met.
    ``restarted_back``: a killed IU's first request after it answers again is judged too (TARGET_BACK_S);
    an edge restart is judged on the requests that had not started streaming only."""
    lines, met = [], True
    for kind, row in numbers["kinds"].items():
        if kind == EDGE_RESTART:
            checks = [(f"requests not yet streaming lost {row['failed_not_streaming']} of {row['requests_during']} "
                       "== 0", row["failed_not_streaming"] == 0)]
        else:
            checks = _unit_checks(kind, row, restarted_back)
        for text, ok in checks:
            met = met and ok
            lines.append(f"{kind} x{row['trials']}: {text}: {'met' if ok else 'NOT met'}")
    return lines, met


def _unit_checks(kind: str, row: dict, restarted_back: bool) -> list[tuple[str, bool]]:
    send_target = TARGET_KILLED_S if kind == "kill" else TARGET_STALLED_S
    checks = [
        (f"client-visible failures {row['failed_not_streaming']} not yet streaming + "
         f"{row['failed_streaming']} streaming of {row['requests_during']} == 0",
         row["failed_not_streaming"] + row["failed_streaming"] == 0),
        (f"longest silence in a stream {row['longest_silence_s']} s <= {TARGET_SILENCE_S:g} s",
         row["longest_silence_s"] <= TARGET_SILENCE_S),
        (f"last new request to the {kind}ed IU {row['last_send_after_fault_s']} s after the fault "
         f"<= {send_target:g} s", row["last_send_after_fault_s"] <= send_target),
        (f"p99 TTFT during the fault {row['p99_ttft_s']} s = {row['ttft_ratio']}x baseline "
         f"{row['baseline_p99_ttft_s']} s <= {TARGET_TTFT_RATIO}x",
         row["ttft_ratio"] is not None and row["ttft_ratio"] <= TARGET_TTFT_RATIO),
    ]
    if restarted_back and kind == "kill":
        back = row["back_in_rotation_s"]
        checks.append((f"the restarted IU's first request {back} s after it answered again "
                       f"<= {TARGET_BACK_S:g} s", back is not None and back <= TARGET_BACK_S))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=4)
    parser.add_argument("--load", type=float, default=0.5, help="mean streams in flight per IU / 8")
    parser.add_argument("--repeats", type=int, default=5, help="trials per fault kind")
    parser.add_argument("--stall-s", type=float, default=8.0)
    parser.add_argument("--client-idle-s", type=float, default=6.0, help="the client's read timeout")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--loopback", default=LOOPBACK, help="first three octets of the services' loopback "
                        "addresses (127.X.Y): Consul on .1, the edge on .2, the IUs from .11")
    results.add_argument(parser, __file__)
    args = parser.parse_args(argv)
    numbers = run(units=args.units, load=args.load, repeats=args.repeats, stall_s=args.stall_s,
                  client_idle_s=args.client_idle_s, seed=args.seed, loopback=args.loopback)
    print(f"{numbers['requests']} streams at {numbers['rate_per_s']} req/s ({args.load * SLOTS:g} in flight per "
          f"IU x {args.units} IUs; a stream takes {numbers['stream_s']} s)")
    print(f"the edge resumed {numbers['streams_resumed']} streams and moved {numbers['requests_moved']} requests "
          "before their first byte (by reason)")
    lines, met = verdict_lines(numbers)
    for kind, row in numbers["kinds"].items():
        print(f"{kind}: {row['requests_during']} requests during the faults; failures: {row['errors'] or 'none'}; "
              f"{row['sends_while_down']} sent to the IU while down; its first request after it answered again "
              f"came {row['back_in_rotation_s']} s later (the longest)")
    for line in lines:
        print(line)
    summary = f"the edge's fault targets (kill, stall): {'met' if met else 'NOT met'}"
    print(summary)
    results.record(args.results, script=__file__, numbers=numbers, summary=summary,
                   argv=[__file__, *(sys.argv[1:] if argv is None else argv)], verdict="met" if met else "not met",
                   target="killed/stalled IU at ~50% load: no client-visible failure, no stream silent > 5 s, "
                          "no request to it > 2 s (killed) / 5 s (stalled) after, p99 TTFT <= 1.15x baseline",
                   measures="an IU's engine killed or stalled under load behind a local edge: client-visible "
                            "failures, stream silences, sends to the faulted IU, p99 TTFT")
    return 0


if __name__ == "__main__":
    sys.exit(main())

