"""``clusterctl scores``: rows from KV bodies + Consul health, via the reader library."""

from __future__ import annotations

import json
import time

import pytest

from consul_io.client import ConsulIO
from sim.vllm.registration import IUService, register_iu_service, register_on_catalog_node
from tests.helpers import run_cli

pytestmark = pytest.mark.integration


def test_scores_json_and_table(consul_addr, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    io = ConsulIO(consul_addr)
    for i in (0, 1):  # on catalog node r01n01, where that node's agent would put them
        register_on_catalog_node(io, IUService(f"r01n01-iu{i}", "r01n01", "r01", "127.0.0.1", 8000 + i, (0, 1), 0),
                                 "127.0.0.1")
    body = {
        "node": "r01n01",
        "rack": "r01",
        "ts": time.time(),
        "heartbeat_s": 2.0,
        "seq": 1,
        "clock_offset_s": None,
        "ius": {
            "r01n01-iu0": {
                "score": 0.2,
                "status": "passing",
                "reason": "",
                "components": {"queue_s": 0.1, "kv_s": 0.0, "step_s": 0.1},
            },
            "r01n01-iu1": {
                "score": None,
                "status": "warning",
                "reason": "missing vllm:kv_cache_usage_perc",
                "components": {},
            },
        },
    }
    assert io.kv_cas_write("clusterctl/eas/dc1/r01n01", json.dumps(body), 0) is not None
    code, out, err = run_cli(capsys, "scores", "--consul", consul_addr, "--json")
    assert code == 0, err
    rows = {r["iu"]: r for r in json.loads(out)}
    assert rows["r01n01-iu0"]["score"] == 0.2 and rows["r01n01-iu0"]["health"] == "passing"
    assert rows["r01n01-iu1"]["score"] is None and rows["r01n01-iu1"]["health"] == "passing"  # no score: warning
    assert rows["r01n01-iu0"]["age_s"] < 5 and not rows["r01n01-iu0"]["stale"]
    code, out, _ = run_cli(capsys, "scores", "--consul", consul_addr)
    assert code == 0 and "r01n01-iu0" in out and "queue_s 0.1 + step_s 0.1" in out  # the score's terms


def test_scores_consul_unreachable_is_one_line(capsys):
    code, out, err = run_cli(capsys, "scores", "--consul", "127.0.0.1:9")
    assert code == 3 and err.startswith("error: cannot reach Consul at 127.0.0.1:9 (")
    assert err.count("\n") == 1 and "address from --consul" in err


def test_scores_lists_inventory_ius_that_publish_nothing(consul_addr, capsys):
    from pathlib import Path

    inventory = Path(__file__).resolve().parents[4] / "inventory" / "virtual"
    code, out, err = run_cli(capsys, "scores", "-i", str(inventory), "--consul", consul_addr, "--json")
    assert code == 1, err  # IUs expected and none publishing: usable from a script
    rows = json.loads(out)
    assert len(rows) == 8 and {r["node"] for r in rows} == {"r01n01", "r01n02", "r02n01", "r02n02"}
    assert all(r["health"] == "unknown" and r["reason"] == "not registered in Consul" for r in rows)


SECRET = "7f3b2d1e-9c4a-4e8f-b1d6-2a5c8e0f4b73"


def test_scores_reads_an_acl_consul_with_a_0600_token_file(capsys, tmp_path, monkeypatch):
    from devconsul.server import DevConsulServer
    from eas_wire.scorebody import IUScore, ScoreBody

    monkeypatch.delenv("CONSUL_HTTP_TOKEN", raising=False)
    token = tmp_path / "consul.token"
    token.write_text(SECRET + "\n")
    token.chmod(0o600)
    with DevConsulServer(addr="127.0.0.1:0", acl_token=SECRET, node_name="r01n01") as server:
        io = ConsulIO(server.address, token=SECRET)
        register_iu_service(io, IUService("r01n01-iu0", "r01n01", "r01", "127.0.0.1", 8000, (0,), 0),
                            http_check=False)
        body = ScoreBody(node="r01n01", rack="r01", ts=time.time(), ius={"r01n01-iu0": IUScore(0.2, "passing")})
        assert io.kv_cas_write("clusterctl/eas/dc1/r01n01", body.dumps(), 0) is not None
        code, out, err = run_cli(capsys, "scores", "--consul", server.address, "--token-file", str(token), "--json")
        assert code == 0, err
        assert [(r["iu"], r["score"]) for r in json.loads(out)] == [("r01n01-iu0", 0.2)]


def test_scores_refuses_a_token_file_others_can_read(capsys, tmp_path):
    token = tmp_path / "consul.token"
    token.write_text(SECRET)
    token.chmod(0o644)
    code, out, err = run_cli(capsys, "scores", "--consul", "127.0.0.1:1", "--token-file", str(token))
    assert code == 2 and err.count("\n") == 1, err
    assert f"--token-file: {token}: readable by group/others (mode 0644); chmod 600" in err and SECRET not in err


def test_an_https_address_is_spoken_to_over_https(consul_addr, capsys, monkeypatch):
    """`--consul https://HOST:PORT` had its scheme dropped and the token went to it in
    cleartext over HTTP. Now it is HTTPS (system CAs): against this plain-HTTP Consul the TLS handshake fails,
    so the command reports it unreachable instead of reading the scores in cleartext."""
    import cli.commands.scores as scores

    schemes = []

    def recording(*args, **kwargs):
        io = ConsulIO(*args, **kwargs)
        schemes.append(io.scheme)
        return io

    monkeypatch.setattr(scores, "ConsulIO", recording)
    code, _, err = run_cli(capsys, "scores", "--consul", f"https://{consul_addr}", "--json")
    assert schemes == ["https"]
    assert code == 3 and f"cannot reach Consul at {consul_addr}" in err
    code, _, _ = run_cli(capsys, "scores", "--consul", f"http://{consul_addr}", "--json")
    assert code == 0 and schemes == ["https", "http"]


def test_an_inventorys_consul_scheme_is_kept(consul_addr, capsys, monkeypatch, tmp_path):
    """consul_scheme: https in the inventory reaches Consul over HTTPS, as preflight and the roles do (scores
    read the bare consul_http_addr and spoke plain HTTP to it, token included)."""
    import shutil
    from pathlib import Path

    import cli.commands.scores as scores

    inventory = tmp_path / "inv"
    shutil.copytree(Path(__file__).resolve().parents[4] / "inventory" / "virtual", inventory)
    group_vars = inventory / "group_vars" / "all.yml"
    text = group_vars.read_text().replace('consul_http_addr: "{{ ansible_host }}:8500"',
                                          f"consul_http_addr: {consul_addr}\nconsul_scheme: https")
    assert "consul_scheme: https" in text
    group_vars.write_text(text)
    schemes = []

    def recording(*args, **kwargs):
        io = ConsulIO(*args, **kwargs)
        schemes.append(io.scheme)
        return io

    monkeypatch.setattr(scores, "ConsulIO", recording)
    code, _, err = run_cli(capsys, "scores", "-i", str(inventory), "--json")
    assert schemes == ["https"], err
    assert code == 3 and f"cannot reach Consul at {consul_addr}" in err


@pytest.mark.parametrize(("given", "problem"), [("nonsense", "is not HOST:PORT"),
                                                ("ftp://127.0.0.1:1", "the scheme must be http or https")])
def test_an_address_that_is_not_one_is_a_usage_error_naming_where_it_came_from(capsys, given, problem):
    """It was an 'internal error (a bug in clusterctl)': the client refused the address outside the command's
    error handling."""
    code, _, err = run_cli(capsys, "scores", "--consul", given, "--json")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: --consul: Consul address {given!r}") and problem in err


def test_scores_with_no_iu_publishing_says_so_and_exits_1(clusterctl, virtual_inventory, consul_addr):
    code, out, _ = clusterctl("scores", "-i", str(virtual_inventory), "--consul", consul_addr, columns=160)
    assert code == 1
    assert out.strip().splitlines()[-1] == "0 of 8 IUs publishing a score"
