"""The processes the edge benches start (bench/edge_proxy.py, bench/announce_cost.py): stand-in IUs that
stream a fixed completion, a bare aiohttp pass-through proxy, a real ``eas-edge``, a dev Consul, and where
each of them runs (``--layout dedicated``: the proxy under test on a CPU of its own)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHUNKS, CHUNK_GAP_S = 8, 0.005  # a stand-in IU's streamed completion: CHUNKS SSE events CHUNK_GAP_S apart


def dedicated_cpus(cpus: set[int]) -> tuple[set[int], set[int]] | None:
    """(the proxy under test's CPU, the others) for ``--layout dedicated``; None with fewer than 2 CPUs."""
    if len(cpus) < 2:
        return None
    proxy = {max(cpus)}
    return proxy, cpus - proxy


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (sched_setaffinity of a pid moves its main thread only)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def run_on(loop_name, main):
    """Every process of the bench but the edge (which picks its own: --event-loop) runs its main() so; the
    scripts below get this function's source."""
    import asyncio

    if loop_name == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


RUN_ON = inspect.getsource(run_on)

# A stand-in IU's streamed completion (the source of a child process's handler): CHUNKS SSE events GAP s
# apart, each carrying its CLOCK_MONOTONIC send time. Also bench/announce_cost.py's stand-in IUs.
STREAMED_COMPLETION = r'''
import asyncio, json, sys, time
from aiohttp import web
async def completions(request):
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range(CHUNKS):
        if i:
            await asyncio.sleep(GAP)
        event = {"choices": [{"index": 0, "text": "tok ", "finish_reason": None}], "sent": time.monotonic()}
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
'''

UPSTREAM = RUN_ON + STREAMED_COMPLETION + r'''
CHUNKS, GAP, LOOP = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
async def main():
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ports = []
    for _ in range(2):
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])
    print(" ".join(map(str, ports)), flush=True)
    await asyncio.Event().wait()
run_on(LOOP, main())
'''

# The floor of any Python async proxy: the same aiohttp client/server hop with no routing, no Consul view, no
# metrics. Added latency splits into this hop (aiohttp + the event loop + the host's scheduling) and what
# is the edge's own (the rest).
BARE_PROXY = RUN_ON + r'''
import asyncio, sys
import aiohttp
from aiohttp import web
LOOP, upstreams = sys.argv[1], sys.argv[2:]
async def completions(request):
    raw = await request.read()
    url = upstreams[completions.n % len(upstreams)]
    completions.n += 1
    async with app["session"].post(url, data=raw, headers={"Content-Type": "application/json"}) as up:
        response = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "")})
        await response.prepare(request)
        while chunk := await up.content.readany():
            await response.write(chunk)
        await response.write_eof()
        return response
completions.n = 0
async def main():
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
app = web.Application()
app.router.add_post("/v1/completions", completions)
run_on(LOOP, main())
'''

def start_edge(consul: str, extra: list[str], cpus: set[int] | None = None, stderr=None
               ) -> tuple[subprocess.Popen, str]:
    """An eas-edge process; (process, client HOST:PORT). Its /metrics address is ``process.admin_address``;
    ``stderr``: where its log goes (a file; None: this process's stderr)."""
    process = subprocess.Popen([sys.executable, "-m", "edge", "--consul", consul, "--listen", "127.0.0.1:0",
                                "--admin-listen", "127.0.0.1:0", "--log-level", "warning", *extra],
                               stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT, preexec_fn=on_cpus(cpus))
    line, admin = process.stdout.readline(), process.stdout.readline()
    if "listening on http://" not in line or "admin on http://" not in admin:
        raise SystemExit(f"eas-edge did not start: {line!r}")
    process.admin_address = admin.split("http://", 1)[1].split()[0]
    return process, line.rsplit("http://", 1)[1].strip()


def on_cpus(cpus: set[int] | None):
    """A preexec_fn that starts a child (and every thread it makes) on ``cpus``; None: where it would run."""
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


class DevConsul:
    """The dev Consul in its own process, so the load generator's CPU does not slow the edge's watches."""

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host  # a loopback address of the bench's own: its services never share one with another run

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-m", "cli.main", "dev", "consul", "--addr", f"{self.host}:0",
                                         "--log-level", "warn"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, cwd=ROOT)
        line = self.process.stdout.readline()
        if "listening on http://" not in line:
            raise SystemExit(f"dev consul did not start: {line!r}")
        self.address = line.split("http://", 1)[1].split()[0]
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(10)


