"""The consul stand-in as processes: a server and a client agent configured only by config files (the shape the
consul_agent role renders), ACLs on with default deny, then the CLI (`consul maint`, `consul reload`) and
SIGTERM with leave_on_terminate."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.devconsul import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]
STANDIN = ROOT / "sim/aptrepo/consul_standin.py"
MANAGEMENT = "9a4c1c0e-1b2d-4e3f-8a9b-0c1d2e3f4a5b"
GOSSIP = "cGFzc3dvcmRwYXNzd29yZA=="


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _get(port: int, path: str, token: str = MANAGEMENT):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"X-Consul-Token": token})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read() or b"null")


def _put(port: int, path: str, body: dict, token: str = MANAGEMENT):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="PUT",
                                     headers={"X-Consul-Token": token})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read() or b"null")


def _token(port: int, rules: str, name: str) -> str:
    _put(port, "/v1/acl/policy", {"Name": name, "Rules": rules})
    return _put(port, "/v1/acl/token", {"Policies": [{"Name": name}]})["SecretID"]


def _wait_http(port: int) -> None:
    assert wait_until(lambda: _try(lambda: _get(port, "/v1/status/leader")), 20), f"nothing serves on {port}"


def _try(fn):
    try:
        return fn() or True
    except OSError:
        return False


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_server_and_client_from_config_files(tmp_path, procs):
    http_s, rpc, http_c = _port(), _port(), _port()
    server_dir, client_dir = tmp_path / "server.d", tmp_path / "client.d"
    server_dir.mkdir()
    client_dir.mkdir()
    (server_dir / "consul.hcl").write_text(f'''
node_name = "srv"
data_dir = "{tmp_path / 'srv-data'}"
server = true
bootstrap_expect = 1
bind_addr = "127.0.0.1"
client_addr = "127.0.0.1"
ports {{ http = {http_s}
  server = {rpc} }}
encrypt = "{GOSSIP}"
acl {{
  enabled = true
  default_policy = "deny"
  tokens {{ initial_management = "{MANAGEMENT}" }}
}}
''')
    procs.append(subprocess.Popen([sys.executable, str(STANDIN), "agent", f"-config-dir={server_dir}"], env=_env()))
    _wait_http(http_s)
    agent_token = _token(http_s, 'node "n1" { policy = "write" }\nservice_prefix "" { policy = "read" }', "agent-n1")
    reg_token = _token(http_s, 'service "vllm-iu" { policy = "write" }', "registration")
    operator = _token(http_s, 'service_prefix "" { policy = "write" }\nnode_prefix "" { policy = "write" }', "op")
    (client_dir / "consul.hcl").write_text(f'''
node_name = "n1"
data_dir = "{tmp_path / 'n1-data'}"
server = false
bind_addr = "127.0.0.1"
client_addr = "127.0.0.1"
ports {{ http = {http_c} }}
retry_join = ["127.0.0.1:{rpc}"]
encrypt = "{GOSSIP}"
acl {{
  enabled = true
  default_policy = "deny"
  tokens {{
    agent = "{agent_token}"
    config_file_service_registration = "{reg_token}"
  }}
}}
''')
    for n in (0, 1):
        (client_dir / f"vllm-iu-n1-iu{n}.json").write_text(json.dumps({"service": {
            "name": "vllm-iu", "id": f"n1-iu{n}", "port": 8000 + n,
            "checks": [{"id": f"vllm-iu:n1-iu{n}:health", "name": "h", "http": f"http://127.0.0.1:{http_c}/v1/status/leader",
                        "interval": "1s", "timeout": "1s"}]}}))
    client = subprocess.Popen([sys.executable, str(STANDIN), "agent", f"-config-dir={client_dir}"], env=_env(),
                              stderr=subprocess.PIPE, text=True)
    procs.append(client)
    _wait_http(http_c)

    def ids(passing: bool = True) -> list[str]:
        query = "?passing=1" if passing else ""
        return sorted(e["Service"]["ID"] for e in _get(http_s, f"/v1/health/service/vllm-iu{query}"))

    assert wait_until(lambda: ids() == ["n1-iu0", "n1-iu1"], 10), ids(False)
    # the operator's quarantine through the CLI, with a token file as Ansible and operators pass it
    token_file = tmp_path / "op.token"
    token_file.write_text(operator)
    maint = subprocess.run([sys.executable, str(STANDIN), "maint", "-enable", "-service=n1-iu1", "-reason=quarantine"],
                           env=_env(CONSUL_HTTP_ADDR=f"127.0.0.1:{http_c}", CONSUL_HTTP_TOKEN_FILE=str(token_file)),
                           capture_output=True, text=True)
    assert maint.returncode == 0, maint.stderr
    assert wait_until(lambda: ids() == ["n1-iu0"], 5)
    denied = subprocess.run([sys.executable, str(STANDIN), "maint", "-disable", "-service=n1-iu1"],
                            env=_env(CONSUL_HTTP_ADDR=f"127.0.0.1:{http_c}", CONSUL_HTTP_TOKEN=agent_token),
                            capture_output=True, text=True)
    assert denied.returncode == 1 and "403" in denied.stderr and "service:write" in denied.stderr
    # a removed definition is gone after `consul reload`; maintenance of the other one stays
    (client_dir / "vllm-iu-n1-iu0.json").unlink()
    def reload(token: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(STANDIN), "reload", f"-http-addr=127.0.0.1:{http_c}",
                               f"-token={token}"], env=_env(), capture_output=True, text=True)

    refused = reload(operator)  # reload is agent:write (the role reloads through systemd, SIGHUP, no token)
    assert refused.returncode == 1 and "lacks permission 'agent:write' on \"n1\"" in refused.stderr
    done = reload(MANAGEMENT)
    assert done.returncode == 0, done.stderr
    assert wait_until(lambda: ids(passing=False) == ["n1-iu1"], 5), ids(False)
    assert "_service_maintenance:n1-iu1" in _get(http_c, "/v1/agent/checks")
    # SIGTERM: a client leaves (leave_on_terminate defaults to true), so its node leaves the catalog
    client.send_signal(signal.SIGTERM)
    assert client.wait(20) == 0
    assert wait_until(lambda: _get(http_s, "/v1/catalog/node/n1") is None, 5)
    started = time.monotonic()
    assert ids(passing=False) == [] and time.monotonic() - started < 5


def test_bad_configuration_is_one_clear_line(tmp_path):
    config = tmp_path / "consul.d"
    config.mkdir()
    (config / "consul.hcl").write_text('server = true\nbind_addr = "node1.example"\n')
    done = subprocess.run([sys.executable, str(STANDIN), "validate", str(config)], env=_env(),
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "bind_addr: 'node1.example' is not an IP address or go-sockaddr template" in done.stderr
    (config / "consul.hcl").write_text('server = true\nencrypt = "c2hvcnQ="\n')
    done = subprocess.run([sys.executable, str(STANDIN), "validate", str(config)], env=_env(),
                          capture_output=True, text=True)
    assert "encrypt: the key must be 16, 24 or 32 bytes, found 5" in done.stderr
