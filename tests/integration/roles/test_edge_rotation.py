"""The edges play's wait for the balancers (roles/eas_edge/tasks/balancers.yml, the
``clusterctl.infra.haproxy_server_ready`` module) run by ansible-playbook against a real HAProxy configured by
the edge_balancer role's template, in front of two stand-in edges whose ``/healthz`` the test sets.

What it shows: an edge answering ``/healthz`` 200 is not yet in HAProxy's rotation (HAProxy takes it back after
``rise`` checks ``inter`` apart), and the wait ends only when HAProxy itself sends to it again; an edge HAProxy
never takes back, or holds in maintenance, fails the play naming it; a balancer not set up yet, or not listing
the edge, is not waited for. HAProxy's view is read with ``show stat`` here, the module uses ``show servers state``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.helpers import REPO, haproxy

pytestmark = pytest.mark.integration

INTER_S, RISE, FALL = 1, 2, 2
BACKEND = "edges"
RENDER = """\
- name: HAProxy's configuration as the edge_balancer role writes it
  hosts: n1
  gather_facts: false
  tasks:
    - name: The balancer and its edges as the model reads them
      ansible.builtin.include_role: {name: edge_balancer, tasks_from: facts, public: true}
    - name: The role's template
      ansible.builtin.template: {src: "%s", dest: "{{ out }}", mode: "0644"}
      vars: {ansible_managed: Ansible managed}
""" % (REPO / "roles/edge_balancer/templates/haproxy.cfg.j2")
WAIT = """\
- name: The edges play's wait for the balancers, for one edge
  hosts: "{{ edge }}"
  gather_facts: false
  tasks:
    - name: Wait as the handler does after a restart
      ansible.builtin.include_role: {name: eas_edge, tasks_from: balancers.yml}
"""


class StandInEdge:
    """An edge's /healthz at the status the test sets (200 serving, 503 draining), on its own thread."""

    def __init__(self, address: str):
        edge = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                body = json.dumps({"status": "ok" if edge.health == 200 else "draining"}).encode()
                self.send_response(edge.health if self.path == "/healthz" else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except ConnectionResetError:
                    pass  # HAProxy's check closes with a reset once it has read the status line

            def log_message(self, *args):
                pass

        self.health = 200
        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.listen = f"{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def playbook(work, text: str, *extra: str, timeout: float = 120, wait: bool = True):
    (work / "play.yml").write_text(text)
    binary = REPO / ".venv/bin/ansible-playbook"
    argv = [str(binary) if binary.exists() else "ansible-playbook", "-v", "-i", str(work / "hosts.yml"),
            str(work / "play.yml"), *(arg for pair in extra for arg in ("-e", pair))]
    env = {**os.environ, "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}  # results on one line each, unfolded
    if not wait:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def wait_for(predicate, timeout_s: float = 15.0) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "HAProxy did not get there"
        time.sleep(0.1)
    return time.monotonic()


def module_runs_under(pid: int) -> bool:
    """Whether a process below ``pid`` runs a module: with ansible.cfg's pipelining, the interpreter alone on its
    command line, the module on its stdin (the wait's play runs no other module)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:-1] != [sys.executable.encode()]:
                    continue
            parent = int(entry)
            while parent > 1 and parent != pid:
                with open(f"/proc/{parent}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            return True
    return False


@pytest.fixture(scope="module")
def balancer(tmp_path_factory):
    binary = haproxy.binary()
    work = tmp_path_factory.mktemp("edge-rotation")
    edges = {"n1": StandInEdge("127.0.76.11"), "n2": StandInEdge("127.0.76.12")}
    stats, admin = work / "stats.sock", work / "admin.sock"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {name: {"ansible_host": f"127.0.76.{11 + i}", **local} for i, name in enumerate(("n1", "n2", "n3"))}
    inventory = {"all": {"hosts": hosts, "vars": {
        "edge_balancer_check_inter": f"{INTER_S}s", "edge_balancer_check_rise": RISE,
        "edge_balancer_check_fall": FALL, "edge_balancer_maxconn": 200}, "children": {
        "edges": {"hosts": {name: {"eas_edge_listen": edge.listen} for name, edge in edges.items()}},
        "balancers": {"hosts": {"n1": {"edge_balancer_listen": "127.0.76.5:18076",
                                       "edge_balancer_stats_socket": str(stats)}}}}}}
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    rendered = playbook(work, RENDER, f"out={work / 'haproxy.cfg'}")
    assert rendered.returncode == 0, rendered.stdout[-3000:]
    config = (work / "haproxy.cfg").read_text()
    assert f"stats socket {stats} mode 600 level user" in config
    # The test's own admin socket, to put an edge in maintenance as an operator would.
    (work / "haproxy.cfg").write_text(config.replace("global\n", f"global\n    stats socket {admin} level admin\n", 1))
    process = subprocess.Popen([binary, "-f", str(work / "haproxy.cfg"), "-db"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: stats.exists() and all(haproxy.status(str(stats), BACKEND, n) == "UP" for n in edges))
        yield work, edges, str(stats), str(admin)
    finally:
        process.terminate()
        process.wait(timeout=10)
        for edge in edges.values():
            edge.close()


@pytest.fixture
def down_edge(balancer):
    """n2 answering 503 and out of HAProxy's rotation; serving and back in it afterwards."""
    work, edges, stats, _ = balancer
    edges["n2"].health = 503
    wait_for(lambda: haproxy.status(stats, BACKEND, "n2").startswith("DOWN"))
    yield balancer
    edges["n2"].health = 200
    wait_for(lambda: haproxy.status(stats, BACKEND, "n2") == "UP")


def test_the_wait_ends_only_when_haproxy_sends_to_the_edge_again(down_edge):
    work, edges, stats, _ = down_edge
    asked_before = haproxy.connections(stats)
    running = playbook(work, WAIT, "edge=n2", "eas_edge_balancer_wait_s=60", wait=False)
    wait_for(lambda: module_runs_under(running.pid), timeout_s=60)
    # The module has asked HAProxy about the down edge: more connections than this test's own questions (a
    # loaded host can take seconds from the module's process to its first question).
    questions = [0]  # this test's since asked_before

    def module_asked() -> bool:
        questions[0] += 1
        return haproxy.connections(stats) - asked_before > questions[0]

    wait_for(module_asked, timeout_s=60)
    assert running.poll() is None, running.stdout.read()[-3000:]
    edges["n2"].health = 200
    # The gap the wait is for: /healthz says 200, HAProxy does not send to the edge yet.
    assert not haproxy.status(stats, BACKEND, "n2").startswith("UP")
    out, _ = running.communicate(timeout=60)
    assert running.returncode == 0, out[-3000:]
    assert haproxy.status(stats, BACKEND, "n2") == "UP"
    [result] = [json.loads(line.split(" => ", 2)[-1]) for line in out.splitlines() if '"waited_s"' in line]
    assert result["in_rotation"] is True and result["balancer"] == "up" and result["server_state"]["srv_op_state"] == "2"
    # It was asking before /healthz answered 200, and went on asking through HAProxy's rise checks (the first
    # passing one at the soonest right after the answer, then RISE - 1 more, INTER_S apart).
    assert result["waited_s"] >= (RISE - 1) * INTER_S * 0.9, result


def test_an_edge_haproxy_does_not_take_back_fails_the_play_naming_it(down_edge):
    work, _, stats, _ = down_edge
    done = playbook(work, WAIT, "edge=n2", "eas_edge_balancer_wait_s=2")
    assert done.returncode != 0
    assert (f"HAProxy at {stats}: server edges/n2 not back in rotation within 2 s (op state 0 (stopped (down))"
            in done.stdout), done.stdout[-3000:]


def test_an_edge_held_in_maintenance_fails_at_once(balancer):
    work, _, stats, admin = balancer
    haproxy.command(admin, "set server edges/n2 state maint")
    try:
        started = time.monotonic()
        done = playbook(work, WAIT, "edge=n2", "eas_edge_balancer_wait_s=60")
        assert done.returncode != 0 and time.monotonic() - started < 30
        assert f"HAProxy at {stats}: server edges/n2 is held out of rotation (forced maintenance;" in done.stdout, (
            done.stdout[-3000:])
    finally:
        haproxy.command(admin, "set server edges/n2 state ready")
    wait_for(lambda: haproxy.status(stats, BACKEND, "n2") == "UP")


@pytest.mark.parametrize(("edge", "extra", "seen"), [
    ("n3", (), '"listed": false'),  # an edge the running HAProxy's configuration does not list yet
    ("n2", ("edge_balancer_stats_socket=/nonexistent/stats.sock",), '"balancer": "absent"'),  # not set up yet
])
def test_a_balancer_with_nothing_to_wait_for_passes(balancer, edge, extra, seen):
    work = balancer[0]
    done = playbook(work, WAIT, f"edge={edge}", "eas_edge_balancer_wait_s=60", *extra)
    assert done.returncode == 0 and seen in done.stdout, done.stdout[-3000:]
