"""The engine around the checks: transports, the parallel runner (unreachable and hanging hosts), exit
codes, profiles, report formats, saved runs and --release."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from preflight import checks as registry
from preflight import history, report
from preflight.checks.base import Check, RunOptions
from preflight.profiles import ProfileError, load_file, profile_for, profile_of
from preflight.release import release_passed
from preflight.result import CheckResult, Verdict
from preflight.runner import exit_code, run_preflight
from preflight.transport import (
    KILL_GRACE_S,
    OUTPUT_CAP_BYTES,
    CommandResult,
    LocalTransport,
    RoutingTransport,
    SshTransport,
)
from tests.preflight.helpers import ScriptedTransport, context, node
from tests.preflight.sshserver import client_transport, finish

# ------------------------------------------------------------------------------ transports


def test_local_transport_runs_argv_without_a_shell(tmp_path):
    marker = tmp_path / "pwned"
    result = LocalTransport().run(node(), ["echo", f"$(touch {marker})", ";", "id"], timeout=5)
    assert result.ok and result.stdout == f"$(touch {marker}) ; id\n"
    assert not marker.exists()


def test_routing_follows_ansible_connection():
    """ansible_connection: local (preflight on the node itself) runs locally; anything else goes over SSH."""
    assert isinstance(RoutingTransport().for_host(node(ansible_connection="local")), LocalTransport)
    assert isinstance(RoutingTransport().for_host(node()), SshTransport)
    assert isinstance(RoutingTransport().for_host(node(ansible_connection="ssh")), SshTransport)


def test_timeout_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    result = LocalTransport().run(node(), ["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"], timeout=0.5)
    assert result.timed_out and result.rc is None and time.monotonic() - started < 5
    child = int(pid_file.read_text())
    assert _gone(child)


def test_a_descendant_that_left_the_group_does_not_hold_the_run(tmp_path):
    """Review L7: after a timeout kills the group, a descendant in its own session (setsid, a daemon) still
    holds stdout/stderr open; the run returns within the kill grace with what came, instead of waiting on it."""
    pid_file = tmp_path / "escaped.pid"
    script = f"echo before; setsid sh -c 'echo $$ > {pid_file}; exec sleep 20' & sleep 30"
    started = time.monotonic()
    try:
        result = LocalTransport().run(node(), ["sh", "-c", script], timeout=0.5)
        assert result.timed_out and result.rc is None
        assert time.monotonic() - started < 0.5 + KILL_GRACE_S + 2
        assert result.stdout == "before\n"
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_local_output_over_the_cap_is_truncated_and_the_command_killed(tmp_path):
    """Review M4 (preflight): stdout was read whole (`communicate`). Reading stops at the cap, the result says
    truncated (rc None: we ended it), and the command's group is killed instead of left writing: here it would
    sleep 30 s after its output, so the run returning at once shows it did not wait for it."""
    pid_file = tmp_path / "flood.pid"
    script = f"echo $$ > {pid_file}; head -c {OUTPUT_CAP_BYTES + 2**20} /dev/zero; exec sleep 30"
    started = time.monotonic()
    result = LocalTransport().run(node(), ["sh", "-c", script], timeout=20)
    assert result.truncated and not result.timed_out and result.rc is None and not result.ok
    assert len(result.stdout) == OUTPUT_CAP_BYTES and result.stderr == ""
    assert time.monotonic() - started < 10
    assert _gone(int(pid_file.read_text()))


def test_local_output_under_the_cap_is_read_as_before():
    """A chatty but legal output (under the cap, on both streams) comes back whole, newlines as text mode
    gave them (CRLF -> LF), with its exit status."""
    script = "head -c 3000000 /dev/zero; printf 'a\\r\\nb\\n'; printf 'err\\n' >&2; exit 3"
    result = LocalTransport().run(node(), ["sh", "-c", script], timeout=20)
    assert (result.rc, result.truncated, result.timed_out) == (3, False, False)
    assert result.stdout == "\0" * 3000000 + "a\nb\n" and result.stderr == "err\n"


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_missing_program_is_a_failed_command_not_an_unreachable_host():
    result = LocalTransport().run(node(), ["/nonexistent/clusterctl-test-tool"], timeout=5)
    assert result.rc is None and not result.unreachable and "No such file" in result.stderr


def test_background_server_is_killed_on_stop(tmp_path):
    server = LocalTransport().start(node(), ["sleep", "30"], limit=60)
    pid = server.proc.pid
    server.stop()
    assert _gone(pid)


def test_ssh_transport_quotes_every_argument(monkeypatch):
    import fabric

    seen = {}

    class FakeConnection:
        def __init__(self, host, user, port, connect_timeout, connect_kwargs):
            seen.update(host=host, user=user, port=port)
            self.client = FakeClient()

        def open(self):
            pass

    def answer(channel, command):
        seen["command"] = command
        channel.sendall(b"ok\n")
        finish(channel, 0)

    monkeypatch.setattr(FakeClient, "handler", staticmethod(answer))

    monkeypatch.setattr(fabric, "Connection", FakeConnection)
    n = node(
        ansible_host="127.0.9.7",
        ansible_user="ops",
        ansible_port=2222,
        rdma_nics=[{"device": "mlx5_0; reboot", "netdev": "ib0"}],
    )
    result = SshTransport().run(n, ["ibping", "-C", n.nics[0].device, "$(id)"], timeout=5)
    assert result.ok
    assert seen == {
        "host": "127.0.9.7",
        "user": "ops",
        "port": 2222,
        # under the host's own limit (5 s + 5), the argv as sh's positional parameters (remote_command)
        "command": """sh -c 'timeout -k 5 10 "$@"; exit $?' sh ibping -C 'mlx5_0; reboot' '$(id)'""",
    }


def test_ssh_connection_failure_is_unreachable(monkeypatch):
    import fabric

    class Refused:
        def __init__(self, **kwargs):
            self.client = FakeClient()

        def open(self):
            raise OSError("[Errno 113] No route to host")

    monkeypatch.setattr(fabric, "Connection", Refused)
    result = SshTransport().run(node(), ["true"], timeout=5)
    assert result.unreachable and "No route to host" in result.stderr


class FakeClient:
    """The paramiko client of a fake fabric Connection: records what the transport configures; its
    transport is a real SSH connection to an in-process server running ``handler`` (default: exit 0)."""

    handler = staticmethod(lambda channel, command: finish(channel, 0))

    def __init__(self):
        self.host_key_files, self.policy, self.system_keys = [], None, False
        self.transport = None

    def get_transport(self):
        if self.transport is None:
            self.transport = client_transport(self.handler)
        return self.transport

    def load_system_host_keys(self, filename=None):
        self.system_keys = True

    def load_host_keys(self, filename):
        self.host_key_files.append(filename)

    def set_missing_host_key_policy(self, policy):
        self.policy = policy


def test_ssh_transport_verifies_host_keys_with_the_inventorys_known_hosts_and_key(monkeypatch, tmp_path):
    """Security review M5: fabric alone auto-adds any host key. The transport loads the system
    known_hosts and the inventory's UserKnownHostsFile and rejects unknown keys; the key is the
    inventory's ansible_ssh_private_key_file."""
    import fabric
    import paramiko

    made = []

    class Recording:
        def __init__(self, **kwargs):
            self.kwargs, self.client = kwargs, FakeClient()
            made.append(self)

        def open(self):
            pass

    known = tmp_path / "known_hosts"
    known.write_text("")
    monkeypatch.setattr(fabric, "Connection", Recording)
    n = node(ansible_host="127.0.9.7", ansible_ssh_private_key_file=str(tmp_path / "id_ed25519"),
             ansible_ssh_common_args=f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes")
    assert SshTransport().run(n, ["true"], timeout=5).ok
    conn = made[0]
    assert conn.client.system_keys and str(known) in conn.client.host_key_files
    assert isinstance(conn.client.policy, paramiko.RejectPolicy)
    assert conn.kwargs["connect_kwargs"]["key_filename"] == [str(tmp_path / "id_ed25519")]
    assert conn.kwargs["connect_kwargs"]["look_for_keys"] is False


def test_a_changed_host_key_is_unreachable_with_the_reason(monkeypatch):
    import fabric
    import paramiko

    class Changed:
        def __init__(self, **kwargs):
            self.client = FakeClient()

        def open(self):
            raise paramiko.BadHostKeyException("127.0.9.7", _ed25519(), _ed25519())

    monkeypatch.setattr(fabric, "Connection", Changed)
    result = SshTransport().run(node(ansible_host="127.0.9.7"), ["true"], timeout=5)
    assert result.unreachable and "host key for 127.0.9.7 changed" in result.stderr


def _ed25519():
    import subprocess
    import tempfile
    from pathlib import Path

    import paramiko

    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/k"], check=True)
        return paramiko.Ed25519Key.from_private_key_file(str(Path(d) / "k"))


@pytest.mark.parametrize(("args", "expected"), [
    ("-o UserKnownHostsFile=/a/kh -o StrictHostKeyChecking=yes", ["/a/kh"]),
    ("-oUserKnownHostsFile=/a/kh", ["/a/kh"]),
    ("-o 'UserKnownHostsFile /a/kh /b/kh'", ["/a/kh", "/b/kh"]),
    ("-o ProxyJump=bastion", []),
])
def test_known_hosts_files_from_ansible_ssh_args(args, expected):
    from pathlib import Path

    from preflight.transport import known_hosts_files

    assert known_hosts_files(node(ansible_ssh_common_args=args)) == [Path(p) for p in expected]


# ------------------------------------------------------------------------------ runner


class Echo(Check):
    """A minimal node check: PASS when `check-me` prints ok, FAIL otherwise."""

    name = "echo"

    def run(self, ctx):
        out = ctx.output(["check-me"])
        verdict = Verdict.PASS if out.strip() == "ok" else Verdict.FAIL
        return [self.result(ctx.node, verdict, "ECHO", out.strip())]


class Broken(Check):
    name = "broken"

    def run(self, ctx):
        raise KeyError("bug")


def cluster_of(names):
    from cluster.model import Cluster, Rack

    return Cluster(racks=(Rack("r01", tuple(node(n) for n in names)),))


def run(transport, names, checks=None, parallel=8, **options):
    cluster = cluster_of(names)
    profiles = {n.name: profile_of(n) for n in cluster.nodes()}
    opts = RunOptions(timeout=options.pop("timeout", 2.0), probe_timeout=1.0, **options)
    return run_preflight(cluster, checks or [Echo()], profiles, transport, opts, parallel)


HEADERLESS_IDLE_INFO = (Path(__file__).resolve().parents[1] / "fixtures" / "preflight" / "cpupower"
                        / "headerless-from-analyzing-cpu.txt").read_text()


class IdleStatesByRack(Check):
    """A rack check reading a parse with a warning (cpupower without its header)."""

    name = "idle_by_rack"
    scope = "rack"

    def gather(self, ctx):
        return ctx.parsed("cpupower", ["cpupower", "idle-info"])

    def evaluate(self, facts, profile, node):
        return [self.result(node, Verdict.PASS, "IDLE_OK", f"{len(facts.states)} states")]

    def run_rack(self, ctx):
        return [r for c in ctx.nodes for r in self.evaluate(ctx.facts[c.node.name], {}, c.node)]


class IdleStatesBracket(IdleStatesByRack):
    """A bracket check: its first reading before the load tests, its second in finish."""

    name = "idle_bracket"
    scope = "bracket"

    def finish(self, ctx, before):
        after = ctx.parsed("cpupower", ["cpupower", "idle-info", "-c", "1"], cache=False)
        return [self.result(ctx.node, Verdict.PASS, "IDLE_OK", f"{len(before.states)}/{len(after.states)} states")]


def test_rack_and_bracket_checks_note_their_parse_warnings_as_node_checks_do():
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n")
    t.on("*", "cpupower", "idle-info", reply=HEADERLESS_IDLE_INFO)
    t.on("*", "cpupower", "idle-info", "-c", "1", reply=HEADERLESS_IDLE_INFO)
    outcome = run(t, ["a", "b"], checks=[IdleStatesByRack(), IdleStatesBracket()])
    by = {(r.check, r.node): r for r in outcome.results}
    assert len(by) == 4 and all(r.verdict is Verdict.PASS for r in by.values())
    assert all(r.reason.endswith("parse warning)") for r in by.values() if r.check == "idle_by_rack")
    assert by[("idle_by_rack", "a")].evidence["parse_warnings"] == [
        "`cpupower idle-info` line 1: no 'CPUidle driver:'/'CPUidle governor:' header (a paste that starts below "
        "it): driver unknown"]
    # the bracket check's results carry both readings' warnings
    assert [w.split(" line")[0] for w in by[("idle_bracket", "b")].evidence["parse_warnings"]] == [
        "`cpupower idle-info`", "`cpupower idle-info -c 1`"]


def test_unreachable_and_hanging_hosts_do_not_stop_the_others():
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n").on("*", "check-me", reply="ok\n")
    t.on(
        "down",
        "uname",
        reply=CommandResult(None, "", "ssh: connect to host down: No route to host", 0.0, unreachable=True),
    )
    t.on("hung", "uname", reply=CommandResult(None, "", "", 1.0, timed_out=True))
    t.on("slow", "check-me", reply=CommandResult(None, "", "", 2.0, timed_out=True))
    outcome = run(t, ["a", "down", "hung", "slow", "b"])
    verdicts = {r.node: (r.verdict, r.reason) for r in outcome.results}
    assert verdicts["a"] == verdicts["b"] == (Verdict.PASS, "ok")
    assert verdicts["down"] == (
        Verdict.UNREACHABLE,
        "host unreachable: ssh: connect to host down: No route to host",
    )
    assert verdicts["hung"] == (Verdict.UNREACHABLE, "host unreachable: no answer within 1s")
    assert verdicts["slow"] == (Verdict.ERROR, "`check-me` timed out after 2s")
    assert exit_code(outcome.results) == 3
    # the code the README's example and the report samples show
    assert {r.code for r in outcome.results if r.verdict == Verdict.UNREACHABLE} == {"HOST_UNREACHABLE"}


def test_nodes_run_in_parallel_bounded_by_parallel():
    active, peak, lock = [0], [0], threading.Lock()

    def slow_probe(argv):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        return CommandResult(0, "5.15\n", "", 0.2)

    t = ScriptedTransport().on("*", "uname", reply=slow_probe).on("*", "check-me", reply="ok\n")
    names = [f"n{i}" for i in range(8)]
    started = time.monotonic()
    run(t, names, parallel=8)
    assert time.monotonic() - started < 1.2 and peak[0] == 8
    peak[0] = 0
    run(t, names, parallel=3)
    assert peak[0] == 3


def test_a_bug_in_one_check_is_an_error_result_not_a_crash():
    t = ScriptedTransport().on("*", "uname", reply="5.15\n").on("*", "check-me", reply="nope\n")
    outcome = run(t, ["a"], checks=[Broken(), Echo()])
    assert [(r.check, r.verdict) for r in outcome.results] == [
        ("broken", Verdict.ERROR),
        ("echo", Verdict.FAIL),
    ]
    assert outcome.results[0].reason == "internal error in broken: KeyError: 'bug'"
    assert exit_code(outcome.results) == 1


def test_exit_codes():
    def r(v):
        return CheckResult("r", "n", None, "c", v, "")

    assert exit_code([r(Verdict.PASS), r(Verdict.SKIP), r(Verdict.WARN)]) == 0
    assert exit_code([r(Verdict.WARN)], strict=True) == 1
    assert exit_code([r(Verdict.FAIL), r(Verdict.UNREACHABLE)]) == 1
    assert exit_code([r(Verdict.ERROR), r(Verdict.PASS)]) == 3
    assert exit_code([r(Verdict.UNREACHABLE)]) == 3


def test_check_selection():
    assert [c.name for c in registry.select(["nccl", "gpu_topology"], None)] == ["gpu_topology", "nccl"]
    assert "consul" not in [c.name for c in registry.select(None, ["consul"])]
    with pytest.raises(ValueError, match="unknown check.*nope"):
        registry.select(["nope"], None)


# ------------------------------------------------------------------------------ profiles


@pytest.mark.parametrize(
    "model, floors",
    [("h100-sxm", {4: 330, 8: 460}), ("h200-sxm", {4: 310, 8: 431}), ("a100-sxm", {4: 165, 8: 228})],
)
def test_every_profile_loads_with_its_cited_floors(model, floors):
    profile = profile_for("n1", {"gpu_model": model})
    assert profile["nccl"]["busbw_min_gbps"] == floors
    assert profile["ib"]["write_lat_max_us"] == 2.5 and profile["time_sync"]["max_offset_ms"] == 1.0


def test_profile_per_group_and_overrides_per_host():
    merged = profile_for(
        "n1",
        {
            "gpu_model": "h100-sxm",
            "preflight_profile": "h200-sxm",
            "preflight_overrides": {"nccl": {"busbw_min_gbps": {8: 400}}},
        },
    )
    assert merged["nccl"]["busbw_min_gbps"] == {8: 400} and merged["gpu"]["nvlink_min"] == 18
    assert profile_for("n1", {"gpu_model": "h100-sxm"})["nccl"]["busbw_min_gbps"][8] == 460  # cache untouched


def test_invalid_profiles_and_overrides_are_clear_errors(tmp_path):
    with pytest.raises(
        ProfileError, match=r"n1: preflight_overrides: ib.write_lat_max_us: expected a number > 0"
    ):
        profile_for(
            "n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"ib": {"write_lat_max_us": "fast"}}}
        )
    with pytest.raises(ProfileError, match="unknown section"):
        profile_for("n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"nccll": {}}})
    with pytest.raises(ProfileError, match="no preflight profile 'b200-sxm'"):
        profile_for("n1", {"gpu_model": "b200-sxm"})
    bad = tmp_path / "bad.yml"
    bad.write_text(
        (load_file.__wrapped__.__globals__["PROFILE_DIR"] / "h100-sxm.yml")
        .read_text()
        .replace("write_bw_min_fraction: 0.90", "write_bw_min_fraction: 90")
    )
    with pytest.raises(
        ProfileError, match=r"ib.write_bw_min_fraction: expected a number in \(0, 1\], got 90"
    ):
        load_file(bad)


def test_every_profile_value_cites_a_source():
    from preflight.profiles import PROFILE_DIR

    for path in PROFILE_DIR.glob("*.yml"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if ":" in line and not line.strip().startswith("#") and not line.rstrip().endswith(":"):
                key = line.split(":")[0].strip()
                commented = "#" in line or lines[i - 1].strip().startswith("#")
                assert commented, f"{path.name}:{i + 1}: {key} has no source comment"


# ------------------------------------------------------------------------------ output and history


def sample_outcome():
    t = ScriptedTransport().on("*", "uname", reply="5.15\n").on("*", "check-me", reply="ok\n")
    t.on("b", "check-me", reply="nope\n")
    t.on("c", "uname", reply=CommandResult(None, "", "no route", 0.0, unreachable=True))
    return run(t, ["a", "b", "c"])


def test_json_document_shape():
    document = report.to_json(sample_outcome())
    assert set(document) == {"results", "summary"}
    assert set(document["results"][0]) == {"rack", "node", "iu", "check", "verdict", "reason", "evidence"}
    s = document["summary"]
    assert (s["nodes"], s["nodes_failed"], s["nodes_unreachable"], s["exit_code"]) == (3, ["b"], ["c"], 1)
    assert s["verdicts"] == {"PASS": 1, "WARN": 0, "FAIL": 1, "ERROR": 0, "SKIP": 0, "UNREACHABLE": 1}
    json.dumps(document)


def test_junit_document(tmp_path):
    path = tmp_path / "junit.xml"
    report.write_junit(path, sample_outcome())
    root = ET.parse(path).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "1", "1")
    cases = {c.get("classname"): c for c in root.iter("testcase")}
    assert cases["r01.b"].find("failure").get("message") == "nope"
    assert cases["r01.c"].find("error").get("type") == "UNREACHABLE"


def test_table_groups_rack_node_check():
    from rich.console import Console

    console = Console(record=True, width=140)
    report.print_report(console, sample_outcome())
    text = console.export_text()
    assert "r01" in text and "FAIL" in text and "UNREACHABLE" in text and "exit code 1" in text


def test_history_files_are_private(tmp_path):
    """A saved run carries host output (reasons, evidence: stderr lines); like provision's events.jsonl
    (security review L4) it is 0600 in a 0700 directory whatever the umask."""
    old = os.umask(0o022)
    try:
        saved = history.save(tmp_path / "state" / "preflight", {"results": []}, {}, started=1_800_000_000)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(saved.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(saved.path.parent).st_mode) == 0o700


def test_history_saves_lists_loads_and_diffs(tmp_path):
    first, second = sample_outcome(), sample_outcome()
    a = history.save(tmp_path, report.to_json(first), {"inventory": "inv"}, started=1_800_000_000)
    doc = report.to_json(second)
    doc["results"] = [dict(r, verdict="PASS", reason="ok") if r["node"] == "b" else r for r in doc["results"]]
    b = history.save(tmp_path, doc, {"inventory": "inv"}, started=1_800_000_000)
    assert (a.id, b.id) == ("20270115T080000Z", "20270115T080000Z-1")
    assert [r.id for r in history.runs(tmp_path)] == [a.id, b.id]
    assert history.load(tmp_path, "latest").id == b.id and history.load(tmp_path, "previous").id == a.id
    [change] = history.diff(history.load(tmp_path, a.id), history.load(tmp_path, "latest")).changes
    assert (change.key[1], change.kind, change.before.verdict, change.after.verdict) == (
        "b",
        "fixed",
        Verdict.FAIL,
        Verdict.PASS,
    )
    with pytest.raises(Exception, match="2 runs matching '2027'"):
        history.load(tmp_path, "2027")


# ------------------------------------------------------------------------------ consul and --release


def register(consul_addr, n, maintenance=True):
    import consul

    host, port = consul_addr.rsplit(":", 1)
    c = consul.Consul(host=host, port=int(port))
    for iu in n.ius:
        c.agent.service.register(
            "vllm-iu",
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
    _, checks = client.health.service("vllm-iu")
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


def test_consul_agent_down_fails_with_a_short_reason():
    import socket

    from preflight.checks.consul import CHECK as consul_check

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx_node = node(consul_http_addr=f"127.0.0.1:{port}")
    [result] = consul_check.run(context(ScriptedTransport(), ctx_node))
    assert (result.verdict, result.code) == (Verdict.FAIL, "CONSUL_AGENT_DOWN")
    assert "connection refused" in result.reason and len(result.reason) < 140


def test_python_is_3_11_or_newer():
    assert sys.version_info >= (3, 11)


def test_every_fault_code_a_check_can_emit_is_declared():
    import inspect
    import re

    from preflight.checks import CHECKS

    common = {"GATHER", "INTERNAL", "HOST_UNREACHABLE"}
    for check in CHECKS:
        source = inspect.getsource(inspect.getmodule(type(check)))
        emitted = set(re.findall(r'"([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)"', source)) - common
        passing = {c for c in emitted if c.endswith(("_OK", "_SKIP")) or c in ("NO_NICS", "IB_NO_PEERS")}
        undeclared = emitted - passing - set(check.codes)
        assert not undeclared, f"{check.name}: codes used but not declared: {sorted(undeclared)}"
        assert check.name in source.split("\n", 1)[0]  # the module docstring opens with the check's name


def test_ssh_background_server_is_bounded_and_quoted(monkeypatch):
    import shlex

    import fabric

    commands = []

    class FakeConnection:
        is_connected = True  # the second command reuses the connection

        def __init__(self, **kwargs):
            self.client = FakeClient()

        def open(self):
            pass

    def answer(channel, command):
        commands.append(command)
        channel.sendall(b"4242\n")
        finish(channel, 0)

    monkeypatch.setattr(FakeClient, "handler", staticmethod(answer))
    monkeypatch.setattr(fabric, "Connection", FakeConnection)
    n = node(rdma_nics=[{"device": "mlx5_0; reboot", "netdev": "ib0"}])
    server = SshTransport().start(n, ["ib_write_lat", "-d", n.nics[0].device, "-p", "18515"], limit=90)
    server.stop()
    launch, kill = commands
    # what the remote login shell runs (remote_command): sh -c 'timeout -k 5 35 "$@"; exit $?' sh ARGV, where
    # ARGV is the launcher, itself `sh -c` with the server's command line
    outer = shlex.split(launch)
    assert outer[:6] == ["sh", "-c", 'timeout -k 5 35 "$@"; exit $?', "sh", "sh", "-c"]
    inner = shlex.split(outer[6].removesuffix(" & echo $!").removesuffix(" >/dev/null 2>&1 </dev/null"))
    assert inner == ["nohup", "timeout", "90", "ib_write_lat", "-d", "mlx5_0; reboot", "-p", "18515"]
    assert shlex.split(kill) == ["sh", "-c", 'timeout -k 5 35 "$@"; exit $?', "sh", "kill", "4242"]


def test_the_ssh_libraries_load_safely_from_many_threads_at_once(tmp_path):
    """The first SSH use happens on the runner's worker threads. Before the import lock, one thread opening
    a connection (fabric) while another ran a command (paramiko.ssh_exception) failed every time in a fresh
    interpreter with "cannot import name 'PKey' from partially initialized module" (CI crash of the demo)."""
    import subprocess

    script = tmp_path / "race.py"
    script.write_text(
        "import threading\n"
        "from cluster.model import Node\n"
        "from cluster.settings import node_settings\n"
        "from preflight.transport import SshTransport\n"
        "transport = SshTransport(connect_timeout=1)\n"
        "barrier, failures = threading.Barrier(8), []\n"
        "def use(i):\n"
        "    n = Node(f'n{i}', '127.0.0.1', 'r1', 'h100-sxm', 8, 4, (0,) * 8, (), (),\n"
        "             node_settings({'ansible_host': '127.0.0.1', 'ansible_port': 1}))\n"
        "    barrier.wait()\n"
        "    try:\n"
        "        if i % 2:\n"
        "            try:\n"
        "                transport._connection(n)\n"
        "            except OSError:\n"
        "                pass\n"
        "        else:\n"
        "            transport.run(n, ['true'], timeout=2)\n"
        "    except ImportError as exc:\n"
        "        failures.append(repr(exc))\n"
        "threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(failures)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script)], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
