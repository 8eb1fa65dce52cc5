"""Load benchmark for the dev Consul server (or any Consul agent given with ``--addr``).

    .venv/bin/python bench/consul_dev_load.py [--addr HOST:PORT] [--seconds 3] [--watchers 256]
                                              [--rate 500] [--watch-seconds 10]

1. KV throughput: 1, 8 and 64 concurrent clients each PUT (then GET) keys for ``--seconds``; reports
   operations per second and p50/p99 latency.
2. Blocking watchers: ``--watchers`` threads hold ``GET /v1/kv/<prefix>?recurse&index=..&wait=5s`` (the
   reader library's query) while 64 writers, one per node key (the EAS agent's pattern), together put
   ``--rate`` writes per second. Reports the write rate achieved, watcher wake-ups, and how
   stale each watcher's view was when it woke (now minus the newest write's timestamp). It "kept up"
   when the achieved rate is within 2 % of the target, no watcher errored, and p99 staleness < 1 s.

Without ``--addr`` the server runs as ``clusterctl dev consul`` in its own process, and the watcher
and writer load run in two more processes, so client work does not share the server's interpreter.
Raw ``http.client`` keep-alive connections keep client overhead low.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import threading
import time

import psutil
from edge_procs import DevConsul

WATCH_PREFIX = "bench/watch/"
NODE_KEYS = 64


def _conn(addr: str) -> http.client.HTTPConnection:
    host, _, port = addr.rpartition(":")
    return http.client.HTTPConnection(host, int(port), timeout=60)


def _call(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None):
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    return resp.status, resp.getheader("X-Consul-Index"), resp.read()


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- phase 1: throughput ----------------------------------------------------------------------

def kv_throughput(addr: str, clients: int, seconds: float, method: str) -> tuple[float, float, float]:
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop_at = time.monotonic() + seconds
    barrier = threading.Barrier(clients)

    def work(n: int) -> None:
        conn = _conn(addr)
        barrier.wait()
        i = 0
        while time.monotonic() < stop_at:
            path = f"/v1/kv/bench/tp/{n}/{i % 16}" if method == "PUT" else f"/v1/kv/bench/get/{i % 16}"
            start = time.perf_counter()
            status, _, _ = _call(conn, method, path, b"x" * 64 if method == "PUT" else None)
            latencies[n].append(time.perf_counter() - start)
            if status != 200:
                raise RuntimeError(f"{method} {path}: HTTP {status}")
            i += 1
        conn.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for per in latencies for x in per]
    return len(flat) / seconds, _pct(flat, 0.5) * 1000, _pct(flat, 0.99) * 1000


# -- phase 2: watchers under write load -------------------------------------------------------

def _watchers(addr: str, count: int, seconds: float, ready, out) -> None:
    stale: list[float] = []
    wakeups = [0]
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.time() + seconds

    def watch() -> None:
        conn = _conn(addr)
        _, index, _ = _call(conn, "GET", f"/v1/kv/{WATCH_PREFIX}?recurse")
        ready.release()
        while time.time() < stop_at:
            try:
                status, new_index, body = _call(conn, "GET", f"/v1/kv/{WATCH_PREFIX}?recurse&index={index}&wait=5s")
            except OSError as exc:
                with lock:
                    errors.append(str(exc))
                return
            now = time.time()
            if status != 200:
                with lock:
                    errors.append(f"HTTP {status}")
                return
            if new_index != index:
                newest = max(float(base64.b64decode(e["Value"])) for e in json.loads(body))
                with lock:
                    wakeups[0] += 1
                    stale.append(now - newest)
            index = new_index

    threads = [threading.Thread(target=watch, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put({"stale": stale, "wakeups": wakeups[0], "errors": errors, "cpu_s": time.process_time()})


def _writers(addr: str, rate: float, seconds: float, out, writers: int = NODE_KEYS) -> None:
    done = [0] * writers
    latencies: list[list[float]] = [[] for _ in range(writers)]
    start = time.monotonic() + 0.2

    def write(n: int) -> None:
        conn = _conn(addr)
        per_writer = rate / writers
        i = 0
        while True:
            due = start + i / per_writer
            if due - start >= seconds:
                break
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            key = f"/v1/kv/{WATCH_PREFIX}node-{n:02d}"  # one writer per node key, as the agents do
            t0 = time.perf_counter()
            status, _, _ = _call(conn, "PUT", key, repr(time.time()).encode())
            latencies[n].append(time.perf_counter() - t0)
            if status == 200:
                done[n] += 1
            i += 1

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    flat = [x for per in latencies for x in per]
    out.put({"writes": sum(done), "elapsed": elapsed, "p99_ms": _pct(flat, 0.99) * 1000})


def watch_under_load(addr: str, watchers: int, rate: float, seconds: float, server_pid: int | None) -> dict:
    conn = _conn(addr)
    for n in range(NODE_KEYS):
        _call(conn, "PUT", f"/v1/kv/{WATCH_PREFIX}node-{n:02d}", repr(time.time()).encode())
    ctx = mp.get_context("spawn")
    ready, results = ctx.Semaphore(0), ctx.Queue()
    watch_proc = ctx.Process(target=_watchers, args=(addr, watchers, seconds + 1.0, ready, results))
    watch_proc.start()
    for _ in range(watchers):
        ready.acquire(timeout=30)
    time.sleep(0.5)  # let every watcher park
    server = psutil.Process(server_pid) if server_pid else None
    server_cpu = sum(server.cpu_times()[:2]) if server else 0.0
    write_proc = ctx.Process(target=_writers, args=(addr, rate, seconds, results))
    write_proc.start()
    first, second = results.get(timeout=seconds + 60), results.get(timeout=seconds + 60)
    server_cpu = (sum(server.cpu_times()[:2]) - server_cpu) if server else float("nan")
    watch_proc.join(10)
    write_proc.join(10)
    watch, write = (first, second) if "stale" in first else (second, first)
    achieved = write["writes"] / write["elapsed"]
    stale = watch["stale"]
    return {
        "watchers": watchers,
        "target_rate": rate,
        "achieved_rate": achieved,
        "write_p99_ms": write["p99_ms"],
        "wakeups_per_s": watch["wakeups"] / seconds,
        "stale_p50_ms": _pct(stale, 0.5) * 1000,
        "stale_p99_ms": _pct(stale, 0.99) * 1000,
        "errors": len(watch["errors"]),
        "server_cpu_pct": 100 * server_cpu / seconds,
        "server_cpu_ms_per_write": 1000 * server_cpu / max(write["writes"], 1),
        "watcher_cpu_pct": 100 * watch["cpu_s"] / (seconds + 1.0),
        "kept_up": achieved >= 0.98 * rate and not watch["errors"] and _pct(stale, 0.99) < 1.0,
    }


# -- driver -----------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", help="benchmark this agent instead of starting a dev server")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--watchers", default="256", help="watcher counts to try, comma-separated (e.g. 256,512)")
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--watch-seconds", type=float, default=10.0)
    args = parser.parse_args()
    with contextlib.nullcontext() if args.addr else DevConsul() as server:
        addr = args.addr or server.address
        print(f"target: {addr} ({'given' if args.addr else 'clusterctl dev consul, own process'})")
        conn = _conn(addr)
        for i in range(16):
            _call(conn, "PUT", f"/v1/kv/bench/get/{i}", b"x" * 64)
        print(f"\nKV throughput ({args.seconds:g} s per cell, 64-byte values)")
        print(f"{'clients':>7} | {'PUT/s':>7} {'p50 ms':>7} {'p99 ms':>7} | {'GET/s':>7} {'p50 ms':>7} {'p99 ms':>7}")
        for clients in (1, 8, 64):
            put = kv_throughput(addr, clients, args.seconds, "PUT")
            get = kv_throughput(addr, clients, args.seconds, "GET")
            print(f"{clients:>7} | {put[0]:>7.0f} {put[1]:>7.2f} {put[2]:>7.2f} | "
                  f"{get[0]:>7.0f} {get[1]:>7.2f} {get[2]:>7.2f}")
        print(f"\nBlocking watchers under write load ({args.watch_seconds:g} s per row)")
        print(f"{'watchers':>8} | {'target w/s':>10} {'done w/s':>8} {'write p99 ms':>12} | "
              f"{'wakeups/s':>9} {'stale p50 ms':>12} {'stale p99 ms':>12} {'errors':>6} | kept up | "
              f"{'server CPU':>10} {'ms/write':>8} {'load avg':>8}")
        for count in (int(n) for n in args.watchers.split(",")):
            res = watch_under_load(addr, count, args.rate, args.watch_seconds, server.process.pid if server else None)
            print(f"{res['watchers']:>8} | {res['target_rate']:>10.0f} {res['achieved_rate']:>8.1f} "
                  f"{res['write_p99_ms']:>12.2f} | {res['wakeups_per_s']:>9.0f} {res['stale_p50_ms']:>12.1f} "
                  f"{res['stale_p99_ms']:>12.1f} {res['errors']:>6} | {'yes' if res['kept_up'] else 'NO ':>7} | "
                  f"{res['server_cpu_pct']:>9.0f}% {res['server_cpu_ms_per_write']:>8.2f} {os.getloadavg()[0]:>8.1f}")
        print("stale = watcher wake-up time minus the newest write's send time; server CPU in % of one core,"
              " ms/write = server CPU per write including the wake-ups it caused;"
              f" {os.cpu_count()} CPUs shared with everything else running")


if __name__ == "__main__":
    main()
