"""``--endpoint`` and its default (cli/endpoint.py): every command that sends traffic through the edges takes the
URL given, else the inventory's balancer, else its first edge, else stops with one line naming the inventory
and what to pass. The commands are run as a shell would; the edges' addresses have nothing listening (a
refused connection is the proof of where the command sent)."""

from __future__ import annotations

import pytest
import yaml

from cli.endpoint import resolve_endpoint
from cluster.ansible.inventory import InventoryError
from common.errors import ExitCode, UsageError

pytestmark = pytest.mark.unit

NODE = {"rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 4, "iu_size": 4, "ansible_connection": "local"}
# Port 1 on this range: nothing listens, so a command that sends there is refused at once.
BALANCER = "127.0.76.5:1"


def inventory(tmp_path, edges: tuple[str, ...] = ("n1", "n2"), balancer: str | None = BALANCER, **more) -> str:
    hosts = {f"n{i}": {**NODE, "ansible_host": f"127.0.76.{10 + i}", **more} for i in (1, 2, 3)}
    children = {}
    if edges:
        children["edges"] = {"hosts": {name: {"eas_edge_listen": f"{hosts[name]['ansible_host']}:1"} for name in edges}}
    if balancer:
        children["balancers"] = {"hosts": {"n3": {"edge_balancer_listen": balancer}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts, "children": children}}))
    return str(path)


def test_the_balancer_is_the_default(tmp_path):
    path = inventory(tmp_path)
    assert resolve_endpoint(None, path) == ("http://127.0.76.5:1", f"the balancer on n3 in {path}")


def test_without_a_balancer_the_first_edge_is(tmp_path):
    path = inventory(tmp_path, edges=("n2", "n1"), balancer=None)
    assert resolve_endpoint(None, path) == ("http://127.0.76.11:1", f"the edge on n1 in {path}")


def test_a_given_endpoint_wins_and_the_inventory_is_not_read(tmp_path):
    missing = str(tmp_path / "no-such-inventory")
    assert resolve_endpoint("127.0.76.9:8080", missing) == ("http://127.0.76.9:8080", "--endpoint")


def test_an_ipv6_balancer_is_bracketed(tmp_path):
    path = inventory(tmp_path, balancer="[::1]:8080")
    assert resolve_endpoint(None, path)[0] == "http://[::1]:8080"


def test_an_inventory_without_edges_names_itself_and_what_to_pass(tmp_path):
    path = inventory(tmp_path, edges=(), balancer=None)
    with pytest.raises(UsageError) as caught:
        resolve_endpoint(None, path)
    assert str(caught.value) == (f"{path}: no host in the 'balancers' or 'edges' group to send to: pass --endpoint "
                                 "http://HOST:PORT (the edges' load balancer, or an edge), or add the edges to the "
                                 "inventory (docs/loadtest.md)")


def test_neither_endpoint_nor_inventory_says_what_to_pass():
    with pytest.raises(UsageError, match=r"^no endpoint to send to: pass --endpoint http://HOST:PORT .* or -i "):
        resolve_endpoint(None, None)


def test_a_bad_edges_group_is_the_inventory_s_problem_not_a_traceback(tmp_path):
    path = inventory(tmp_path, balancer="127.0.76.12:9")  # n2's own address
    with pytest.raises(InventoryError) as caught:
        resolve_endpoint(None, path)
    assert caught.value.exit_code == ExitCode.USAGE
    assert "n3: edge_balancer_listen='127.0.76.12:9': 127.0.76.12 is the address of host n2" in str(caught.value)


@pytest.mark.parametrize("command", [("loadtest", "--duration", "1"), ("edge", "calibrate", "--requests", "10")])
def test_loadtest_and_calibrate_send_to_the_inventory_s_balancer(clusterctl, tmp_path, command):
    path = inventory(tmp_path, consul_http_addr="{{ ansible_host }}:1")  # loadtest's Consul: the inventory's
    code, _, err = clusterctl(*command, "-i", path, columns=300)
    assert code == 2, err
    assert f"endpoint: http://127.0.76.5:1 (the balancer on n3 in {path})" in err
    assert "http://127.0.76.5:1: unreachable" in err  # sent there, and nowhere else


@pytest.mark.parametrize("command", [("loadtest",), ("edge", "calibrate")])
def test_loadtest_and_calibrate_without_an_endpoint_are_one_line_exit_2(clusterctl, tmp_path, command):
    code, _, err = clusterctl(*command, columns=300)
    assert code == 2 and err.strip().splitlines() == [
        "error: no endpoint to send to: pass --endpoint http://HOST:PORT (the edges' load balancer, or an edge), or "
        "-i INVENTORY whose 'balancers' or 'edges' group names it"]
    path = inventory(tmp_path, edges=(), balancer=None)
    code, _, err = clusterctl(*command, "-i", path, columns=300)
    assert code == 2 and err.strip().splitlines()[0].startswith(f"error: {path}: no host in the 'balancers' or 'edges'")


def test_a_drill_goes_through_the_inventory_s_balancer(clusterctl, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))  # a systemctl or kill run would fail loudly
    monkeypatch.delenv("CONSUL_HTTP_ADDR", raising=False)
    path = inventory(tmp_path, drills_allowed=True)
    code, _, err = clusterctl("drill", "engine-crash", "-i", path, "--target", "n1-iu0", columns=300)
    assert code == 2, err
    assert f"endpoint: http://127.0.76.5:1 (the balancer on n3 in {path})" in err
    assert "http://127.0.76.5:1" in err.strip().splitlines()[-1]


def test_a_drill_on_an_inventory_without_edges_names_it(clusterctl, tmp_path):
    path = inventory(tmp_path, edges=(), balancer=None, drills_allowed=True)
    code, _, err = clusterctl("drill", "engine-crash", "-i", path, columns=300)
    assert code == 2 and err.strip().splitlines()[0].startswith(f"error: {path}: no host in the 'balancers' or")


@pytest.mark.parametrize("command", [("loadtest",), ("edge", "calibrate")])
def test_an_api_key_file_others_can_read_or_without_a_key_is_one_line_exit_2(clusterctl, tmp_path, command):
    key = tmp_path / "client.key"
    key.write_text("k3y\n")
    key.chmod(0o644)
    code, _, err = clusterctl(*command, "--endpoint", f"http://{BALANCER}", "--api-key-file", str(key), columns=300)
    assert code == 2 and err.strip().splitlines() == [
        f"error: --api-key-file {key}: mode 0644 lets others read the key: chmod 600 it"]
    key.write_text("\n")
    key.chmod(0o600)
    code, _, err = clusterctl(*command, "--endpoint", f"http://{BALANCER}", "--api-key-file", str(key), columns=300)
    assert code == 2 and err.strip().splitlines() == [f"error: --api-key-file {key}: holds no key (the first line is the key)"]


def test_an_api_key_file_gives_its_first_line(tmp_path):
    from cli.endpoint import read_api_key

    key = tmp_path / "client.key"
    key.write_text("k3y  \nnot this\n")
    key.chmod(0o600)
    assert read_api_key(str(key)) == "k3y" and read_api_key(None) is None
    with pytest.raises(UsageError, match="cannot be read"):
        read_api_key(str(tmp_path / "missing"))
