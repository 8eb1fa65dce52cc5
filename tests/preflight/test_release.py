"""preflight/release.py: only nodes that passed are released; a failed Consul call is one ERROR naming why,
and the other nodes are still released. (Releasing against a real agent: tests/preflight/test_runner.py's
consul test and, on the machines, tests/preflight/test_e2e_virtual.py.)"""

from __future__ import annotations

import socket

from preflight import consul as consul_io
from preflight.checks.base import RunOptions
from preflight.release import release_passed
from preflight.result import CheckResult, Verdict
from preflight.runner import RunOutcome
from tests.preflight.helpers import node


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
