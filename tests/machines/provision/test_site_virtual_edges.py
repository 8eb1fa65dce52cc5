"""The edges and their balancer as site.yml provisions them, on test_site_virtual's cluster (the package's
``provisioned``): two edges (r01n01, r02n01) behind HAProxy on its own address (127.0.1.5:8080).

Run after test_site_virtual (the file order; both ``machines(order=9)``), whose last test stops two nodes'
Consul agents: the module's first fixture starts every agent again and releases every node, as a passed
preflight would, so that the IUs are routable whatever that test left.

Through HAProxy: a chat completion is answered; the edge carrying a stream is stopped (systemd's SIGTERM: a
drain) and the stream still ends with [DONE] while every new request is answered by the other edge; the
stopped edge comes back into HAProxy's rotation; a changed edge setting rolls out through edges.yml one edge
at a time while requests keep being answered (with it the routing headers test_site_virtual_operations needs)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

from tests.helpers.devconsul import wait_until
from tests.helpers.provision import VirtualCluster

pytestmark = [pytest.mark.machines(order=9), pytest.mark.timeout(900)]

BALANCER = "http://127.0.1.5:8080"
EDGES = {"r01n01": "127.0.1.11:8080", "r02n01": "127.0.2.11:8080"}


def _call(path: str, body: dict | None = None, base: str = BALANCER, timeout: float = 60) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError as exc:
        return 0, str(exc).encode()


def _healthz(edge: str) -> dict:
    status, body = _call("/healthz", base=f"http://{EDGES[edge]}", timeout=5)
    return json.loads(body) if status in (200, 503) else {"status": f"unreachable ({status})"}


def _chat(model: str, stream: bool = False, tokens: int = 8) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": tokens, "stream": stream}


@pytest.fixture(scope="module")
def cluster(provisioned) -> VirtualCluster:
    return provisioned


@pytest.fixture(scope="module")
def model(cluster) -> str:
    run = cluster.runs["first"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-1000:]
    assert wait_until(cluster.release_every_node, 60)
    assert wait_until(lambda: all(_healthz(e)["status"] == "ok" for e in EDGES), 90), {e: _healthz(e) for e in EDGES}
    if not wait_until(lambda: _call("/v1/models")[0] == 200, 30):
        status = cluster.on_host("r01n01", "sh", "-c", "systemctl status haproxy --no-pager -l; "
                                 "journalctl -u haproxy -n 40 --no-pager; ss -ltnp | grep 8080")
        pytest.fail(f"HAProxy answers {_call('/v1/models')}:\n{status.stdout}\n{status.stderr}")
    return json.loads(_call("/v1/models")[1])["data"][0]["id"]


def _open_files(cluster: VirtualCluster, host: str, pid: str) -> tuple[int, int]:
    """(soft, hard) descriptor limit of a process on the machine, from its /proc/PID/limits."""
    limits = cluster.on_host(host, "sh", "-c", f"cat /proc/{pid}/limits")
    (line,) = [line for line in limits.stdout.splitlines() if line.startswith("Max open files")]
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


def test_the_edges_run_as_the_roles_wrote_them(cluster, model):
    for edge in EDGES:
        assert cluster.on_host(edge, "systemctl", "is-active", "eas-edge.service").stdout.strip() == "active"
        # LimitNOFILE=65536, as systemd applies it: at most the machine's own hard limit (its PID 1's, which a
        # machine inherits from the development host), soft raised to hard
        configured = int(cluster.on_host(edge, "systemctl", "show", "-p", "LimitNOFILE", "--value", "eas-edge").stdout)
        ceiling = _open_files(cluster, edge, "1")[1]
        limits = _open_files(cluster, edge, "$(systemctl show -p MainPID --value eas-edge)")
        assert configured == 65536 and limits == (min(configured, ceiling),) * 2, (configured, ceiling, limits)
        modes = cluster.on_host(edge, "stat", "-c", "%a %U %n", "/etc/eas-edge/consul.token",
                                "/etc/eas-edge/announce.key", "/etc/eas-edge/iu-api-key").stdout.split("\n")
        assert all(line.startswith("600 eas-edge ") for line in modes if line), modes
        command = cluster.on_host(edge, "systemctl", "show", "-p", "ExecStart", "eas-edge").stdout
        assert "--config /etc/eas-edge/edge.yml" in command and "key" not in command.replace("announce.key", "")
    assert cluster.on_host("r01n01", "systemctl", "is-active", "haproxy.service").stdout.strip() == "active"


def test_a_chat_completion_goes_through_haproxy(model):
    status, body = _call("/v1/chat/completions", _chat(model))
    assert status == 200, body[:500]
    assert json.loads(body)["choices"][0]["message"]["content"]


def test_stopping_the_edge_that_carries_a_stream_loses_neither_the_stream_nor_a_new_request(cluster, model):
    result: dict = {}

    def stream() -> None:
        result["out"] = _call("/v1/chat/completions", _chat(model, stream=True, tokens=200), timeout=120)

    client = threading.Thread(target=stream)
    client.start()
    assert wait_until(lambda: any(_healthz(e).get("inflight") for e in EDGES), 20), {e: _healthz(e) for e in EDGES}
    carrier = next(e for e in EDGES if _healthz(e).get("inflight"))
    other = next(e for e in EDGES if e != carrier)
    stopping = threading.Thread(target=cluster.on_host, args=(carrier, "systemctl", "stop", "eas-edge.service"))
    stopping.start()
    answers = []
    deadline = time.monotonic() + 8  # past HAProxy's 2 x 2 s checks: before, during and after it marks the edge down
    while time.monotonic() < deadline:
        answers.append(_call("/v1/chat/completions", _chat(model))[0])
    client.join(120)
    stopping.join(60)
    status, body = result["out"]
    assert status == 200 and body.rstrip().endswith(b"data: [DONE]"), body[-500:]
    assert answers and set(answers) == {200}, answers
    assert _healthz(other)["status"] == "ok"
    # back: systemd starts it, HAProxy's checks bring it into rotation (rise 2)
    assert cluster.on_host(carrier, "systemctl", "start", "eas-edge.service").returncode == 0
    assert wait_until(lambda: _healthz(carrier).get("status") == "ok", 60), _healthz(carrier)


def test_a_changed_setting_rolls_out_one_edge_at_a_time_while_requests_are_answered(cluster, model):
    # and the routing headers, which test_site_virtual_operations' commands read (one rollout for both)
    with (cluster.inventory / "group_vars" / "all.yml").open("a") as f:
        f.write("eas_edge_max_queue: 256\neas_edge_debug_headers: true\n")
    answers: list[int] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            answers.append(_call("/v1/chat/completions", _chat(model))[0])

    client = threading.Thread(target=load)
    client.start()
    try:
        run = cluster.provision("edges", "--playbook", "edges.yml")
    finally:
        stop.set()
        client.join(60)
    assert run.returncode == 0, run.stdout[-4000:]
    for edge in EDGES:
        assert "max_queue: 256" in cluster.read(edge, "/etc/eas-edge/edge.yml")
    events = [json.loads(line) for line in (cluster.run_dirs["edges"] / "events.jsonl").read_text().splitlines()]
    restarts = [e["event_data"]["host"] for e in events if e["event"] == "runner_on_ok"
                and e["event_data"].get("task") == "Restart eas-edge"]
    assert restarts == list(EDGES), restarts  # one at a time, in the play's order
    assert answers and set(answers) == {200}, sorted(set(answers))
    for edge in EDGES:
        rolled = yaml.safe_load(cluster.read(edge, "/etc/eas-edge/edge.yml"))
        assert (rolled["max_queue"], rolled["debug_headers"]) == (256, True), rolled
