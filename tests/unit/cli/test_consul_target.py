"""``--consul`` and its default (cli/consul_target.py): the operate commands with an inventory (``loadtest``,
``edge calibrate``, ``drill``) take the address given, else the inventory's ``consul_http_addr`` (with its
``consul_scheme`` and token), of the node whose agent they need when they need one; an inventory that cannot
say is one line naming the file, the node and the field. The commands are run as a shell would; nothing
listens at the inventory's addresses (a refused connection is the proof of where a command sent)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli.consul_target import node_of_unit, resolve_consul
from cli.endpoint import load_checked
from common.errors import UsageError
from tests.unit.cli.test_endpoint import inventory

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for name in ("CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def consul_inventory(tmp_path, **more) -> str:
    """test_endpoint's inventory, each node's agent at its own address, port 1 (nothing listens)."""
    return inventory(tmp_path, consul_http_addr="{{ ansible_host }}:1", **more)


def test_loadtest_reads_the_inventory_s_consul(clusterctl, tmp_path):
    path = consul_inventory(tmp_path)
    code, _, err = clusterctl("loadtest", "-i", path, "--duration", "1", columns=300)
    assert code == 2, err
    assert f"consul: 127.0.76.11:1 (consul_http_addr of n1 in {path})" in err


def test_a_given_consul_wins_and_says_nothing(clusterctl, tmp_path):
    path = consul_inventory(tmp_path)
    code, _, err = clusterctl("loadtest", "-i", path, "--consul", "127.0.76.30:1", "--duration", "1", columns=300)
    assert code == 2 and "consul:" not in err


def test_an_inventory_without_consul_http_addr_is_one_line_exit_2(clusterctl, tmp_path):
    path = inventory(tmp_path)
    code, _, err = clusterctl("loadtest", "-i", path, "--duration", "1", columns=300)
    assert code == 2 and err.strip().splitlines() == [
        f"error: {path}: no host sets consul_http_addr, so no Consul agent can be reached from here: set it "
        "(HOST:PORT) in the inventory, or pass --consul HOST:PORT"]
    assert "endpoint:" not in err  # stopped before anything was sent


def test_without_the_inventory_s_address_consul_http_addr_from_the_environment_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "127.0.76.31:1")
    path = inventory(tmp_path)
    target = resolve_consul(None, load_checked(path))
    assert (target.address, target.origin) == (
        "127.0.76.31:1", f"CONSUL_HTTP_ADDR (no host of {path} sets consul_http_addr)")


def test_no_inventory_no_option_no_environment_is_no_consul():
    assert resolve_consul(None, None) is None


def test_the_scheme_and_token_come_with_the_address(tmp_path):
    token = tmp_path / "consul.token"
    token.write_text("0c3f7a52-64d5-4b4e-9f6b-1a2b3c4d5e6f\n")
    token.chmod(0o600)
    path = consul_inventory(tmp_path, consul_scheme="https", consul_token_file=str(token), consul_datacenter="dc7")
    target = resolve_consul(None, load_checked(path))
    assert (target.address, target.scheme, target.dc) == ("127.0.76.11:1", "https", "dc7")
    assert target.token == "0c3f7a52-64d5-4b4e-9f6b-1a2b3c4d5e6f" and "0c3f" not in repr(target)
    io = target.io(timeout_s=1.0)
    assert (io.scheme, io.address) == ("https", "127.0.76.11:1")


def test_a_token_file_others_can_read_names_the_inventory_and_node(tmp_path):
    token = tmp_path / "consul.token"
    token.write_text("0c3f7a52-64d5-4b4e-9f6b-1a2b3c4d5e6f\n")
    token.chmod(0o644)
    path = consul_inventory(tmp_path, consul_token_file=str(token))
    with pytest.raises(UsageError, match=rf"^{path}: n1: consul_token_file "):
        resolve_consul(None, load_checked(path))


def test_calibrate_s_breaker_unit_uses_its_own_node_s_agent(clusterctl, tmp_path):
    path = consul_inventory(tmp_path)
    code, _, err = clusterctl("edge", "calibrate", "-i", path, "--requests", "10", "--breaker-unit", "n2-iu0",
                              columns=300)
    assert code == 2, err
    assert f"consul: 127.0.76.12:1 (consul_http_addr of n2 in {path})" in err


def test_a_breaker_unit_the_inventory_lacks_is_named(clusterctl, tmp_path):
    path = consul_inventory(tmp_path)
    code, _, err = clusterctl("edge", "calibrate", "-i", path, "--requests", "10", "--breaker-unit", "n9-iu0",
                              columns=300)
    assert code == 2 and err.strip().splitlines() == [
        f"error: {path}: no IU 'n9-iu0' in the inventory (its IUs: n1-iu0, n2-iu0, n3-iu0): name one of them, "
        "or pass --consul HOST:PORT"]


def test_a_breaker_unit_s_node_without_an_address_is_named_even_when_another_has_one(clusterctl, tmp_path):
    path = consul_inventory(tmp_path)
    data = yaml.safe_load(Path(path).read_text())
    del data["all"]["hosts"]["n2"]["consul_http_addr"]
    Path(path).write_text(yaml.safe_dump(data))
    loaded = load_checked(path)
    with pytest.raises(UsageError) as caught:
        resolve_consul(None, loaded, node=node_of_unit(loaded, "n2-iu0"))
    assert str(caught.value) == (
        f"{path}: n2: consul_http_addr is not set, so its Consul agent (which holds its services' maintenance) "
        "cannot be reached from here: set it (HOST:PORT), or pass --consul HOST:PORT")


def test_a_drill_watches_its_target_s_agent_and_runs_without_one(clusterctl, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))  # a systemctl or kill run would fail loudly
    path = consul_inventory(tmp_path, drills_allowed=True)
    code, _, err = clusterctl("drill", "engine-crash", "-i", path, "--target", "n2-iu0", columns=300)
    assert code == 2, err
    assert f"consul: 127.0.76.12:1 (consul_http_addr of n2 in {path})" in err
    loaded = load_checked(inventory(tmp_path, drills_allowed=True))
    assert resolve_consul(None, loaded, node=node_of_unit(loaded, "n2-iu0"), optional=True) is None
