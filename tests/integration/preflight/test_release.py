"""preflight/release.py: only nodes that passed are released; a failed Consul call is one ERROR naming why,
and the other nodes are still released. (Releasing against a real agent: tests/integration/preflight/transport/test_local.py's
consul test and, on the machines, tests/machines/preflight/test_e2e_virtual.py.)"""

from __future__ import annotations

import socket

import pytest

from preflight import consul as consul_io
from preflight.checks.base import RunOptions
from preflight.profiles import profile_of
from preflight.release import release_passed
from preflight.result import CheckResult, Verdict
from preflight.runner import RunOutcome, run_preflight
from tests.helpers.preflight import ScriptedTransport, node
from tests.unit.preflight.test_runner import Echo

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outcome(verdicts: dict[str, Verdict]) -> RunOutcome:
    results = [CheckResult("r01", name, None, "echo", v, "x", {}) for name, v in verdicts.items()]
    return RunOutcome(results, 0.0, 1.0, RunOptions(timeout=1), ["echo", "consul"])


def test_release_skips_failed_nodes_and_reports_an_unreachable_agent(monkeypatch):
    down = node("down", consul_http_addr=f"127.0.0.1:{_closed_port()}")
    good, bad, warn = node("good"), node("bad"), node("warn")
    calls = []
    real = consul_io.release
    monkeypatch.setattr(consul_io, "release",
                        lambda n: real(n) if n.name == "down" else calls.append(n.name) or [f"{n.name}-iu0"])
    outcome = _outcome({"bad": Verdict.FAIL, "down": Verdict.PASS, "good": Verdict.PASS, "warn": Verdict.WARN})
    released = release_passed([bad, down, good, warn], outcome, strict=True)
    assert released == {"good": ["good-iu0"]} == outcome.released
    assert calls == ["good"], "a FAIL never releases; with --strict a WARN does not either"
    [error] = [r for r in outcome.results if r.verdict is Verdict.ERROR]
    assert (error.node, error.check, error.code) == ("down", "consul", "RELEASE_FAILED")
    assert error.reason.startswith("--release failed: ") and "connection refused" in error.reason
    assert [(r.node, r.check) for r in outcome.results][:3] == [("bad", "echo"), ("down", "echo"), ("down", "consul")]
    assert release_passed([warn], _outcome({"warn": Verdict.WARN})) == {"warn": ["warn-iu0"]}


def test_a_node_whose_release_raises_anything_is_its_error_and_the_others_are_released(monkeypatch, tmp_path):
    """Only ConsulUnavailable was caught: a token file that cannot be read (TokenError) ended --release at
    that node, the nodes after it stayed in maintenance, and the command wrote no JSON, JUnit or history."""
    from consul_io.client import TokenError

    first, second, third = node("first"), node("second"), node("third")

    def release(n):
        if n.name == "second":
            raise TokenError(f"consul_token_file: {tmp_path}/consul.token: cannot read the token file")
        return [f"{n.name}-iu0"]

    monkeypatch.setattr(consul_io, "release", release)
    outcome = _outcome({"first": Verdict.PASS, "second": Verdict.PASS, "third": Verdict.PASS})
    assert release_passed([first, second, third], outcome) == {"first": ["first-iu0"], "third": ["third-iu0"]}
    [error] = [r for r in outcome.results if r.verdict is Verdict.ERROR]
    assert (error.node, error.code) == ("second", "RELEASE_FAILED")
    assert error.reason == f"--release failed: TokenError: consul_token_file: {tmp_path}/consul.token: cannot read the token file"


def test_the_agent_check_sends_the_token_under_default_deny(tmp_path):
    # py-consul's agent.self() sends no token: with ACLs on, preflight's consul check read every agent as
    # down ("lacks permission 'agent:read'") although the inventory had consul_token_file.
    from devconsul.server import DevConsulServer

    secret = "5e0c6a1e-2b8d-4f4a-9d7e-0a1b2c3d4e5f"
    server = DevConsulServer(addr="127.0.0.1:0", acl_token=secret).start()
    try:
        token_file = tmp_path / "consul.token"
        token_file.write_text(secret + "\n")
        token_file.chmod(0o600)
        alive = consul_io.agent_alive(node("tok", consul_http_addr=server.address, consul_token_file=str(token_file)))
        assert alive["agent"], alive
        try:
            consul_io.agent_alive(node("anon", consul_http_addr=server.address))
        except consul_io.ConsulUnavailable as exc:
            assert "Permission denied" in str(exc) or "ACL" in str(exc), exc
        else:
            raise AssertionError("an anonymous request must be refused under default deny")
    finally:
        server.stop()


def register(consul_addr, n, maintenance=True):
    import consul

    host, port = consul_addr.rsplit(":", 1)
    c = consul.Consul(host=host, port=int(port))
    for iu in n.ius:
        c.agent.service.register(
            f"vllm-iu-{n.name}",
            service_id=iu.id,
            port=iu.port,
            tags=[f"rack:{n.rack}", f"node:{n.name}"],
            meta={
                "gpus": iu.cuda_visible_devices,
                "numa_node": str(iu.numa_node),
                "node": n.name,
                "rack": n.rack,
            },
        )
        if maintenance:
            c.agent.service.maintenance(iu.id, True, reason="waiting for preflight")
    return c


def test_consul_check_and_release_only_where_everything_passed(consul_addr):
    from cluster.model import Cluster, Rack
    from preflight.checks.consul import CHECK as consul_check

    good, bad, missing = (node(n, consul_http_addr=consul_addr) for n in ("good", "bad", "missing"))
    for n in (good, bad):
        client = register(consul_addr, n)
    cluster = Cluster(racks=(Rack("r01", (good, bad, missing)),))
    t = ScriptedTransport().on("*", "uname", reply="5.15\n").on("*", "check-me", reply="ok\n")
    t.on("bad", "check-me", reply="nope\n")
    profiles = {n.name: profile_of(n) for n in cluster.nodes()}
    outcome = run_preflight(cluster, [Echo(), consul_check], profiles, t, RunOptions(timeout=2))
    assert outcome.released == {}, "the runner only judges"
    assert release_passed(cluster.nodes(), outcome) == {"good": ["good-iu0", "good-iu1"]}
    by = {(r.node, r.check): r for r in outcome.results}
    assert by[("good", "consul")].verdict is Verdict.PASS
    assert "in maintenance: good-iu0, good-iu1" in by[("good", "consul")].reason
    assert (by[("missing", "consul")].verdict, by[("missing", "consul")].code) == (
        Verdict.FAIL,
        "CONSUL_SERVICE_MISSING",
    )
    assert outcome.released == {"good": ["good-iu0", "good-iu1"]}
    checks = [e for name in ("vllm-iu-good", "vllm-iu-bad", "vllm-iu-missing")
              for e in client.health.service(name)[1]]
    maintenance = {
        e["Service"]["ID"]
        for e in checks
        for ch in e["Checks"]
        if ch["CheckID"].startswith("_service_maintenance:")
    }
    assert maintenance == {"bad-iu0", "bad-iu1"}
    # the release markers the consul_agent role reads (written only where preflight passed)
    _, markers = client.kv.get("clusterctl/preflight/dc1/", keys=True)
    assert markers == ["clusterctl/preflight/dc1/good-iu0", "clusterctl/preflight/dc1/good-iu1"]
