"""`clusterctl remediate` (cli/commands/remediate.py): bad input refused with one line and exit 2 before Consul or
any host is contacted."""

from __future__ import annotations

import pytest
import yaml

pytestmark = pytest.mark.unit

HOST = {"ansible_host": "127.0.73.2", "rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 8, "iu_size": 4,
        "ansible_connection": "local", "consul_http_addr": "127.0.73.1:1"}


def inventory(tmp_path) -> str:
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"n1": HOST}}}))
    return str(path)


@pytest.fixture(autouse=True)
def no_programs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))  # a systemctl or nvidia-smi run would fail loudly


def test_an_unknown_unit_is_named_with_the_known_ones(clusterctl, tmp_path):
    code, _, err = clusterctl("remediate", "-i", inventory(tmp_path), "--target", "n9-iu0", columns=300)
    assert code == 2
    assert err.strip().splitlines() == ["error: --target 'n9-iu0': no such IU in the inventory (IUs: n1-iu0, n1-iu1)"]


def test_a_node_is_not_a_unit(clusterctl, tmp_path):
    code, _, err = clusterctl("remediate", "-i", inventory(tmp_path), "--target", "n1", "--apply", columns=300)
    assert code == 2 and "--target 'n1': no such IU" in err


@pytest.mark.parametrize("option, value, message", [
    ("--max-unit-share", "0", "error: --max-unit-share: must be in (0, 1] (got 0)"),
    ("--max-nodes-per-rack", "0", "error: --max-nodes-per-rack: must be at least 1 (got 0)"),
])
def test_breaker_limits_out_of_range_are_refused(clusterctl, tmp_path, option, value, message):
    code, _, err = clusterctl("remediate", "-i", inventory(tmp_path), "--target", "n1-iu0", option, value,
                              "--apply", columns=300)
    assert code == 2 and err.strip().splitlines() == [message]


def test_an_unknown_rung_is_a_usage_error(clusterctl, tmp_path):
    code, _, err = clusterctl("remediate", "-i", inventory(tmp_path), "--target", "n1-iu0", "--from", "replace",
                              columns=300)
    assert code == 2 and "'replace' is not one of 'restart', 'gpu_reset', 'fabric_reset', 'reboot', 'repair'" in err


def test_a_consul_address_that_is_not_host_port_is_a_usage_error(clusterctl, tmp_path):
    code, _, err = clusterctl("remediate", "-i", inventory(tmp_path), "--target", "n1-iu0", "--consul", "ftp://x:1",
                              columns=300)
    assert code == 2
    assert err.strip().splitlines() == ["error: --consul: Consul address 'ftp://x:1': the scheme must be http or https"]
