"""The roles' filters (playbooks/filter_plugins/cluster_model.py) on the virtual inventory, without hosts:
they validate like ``clusterctl inventory validate``, and what they return is what the golden files of
the rendered configs hold."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from cluster import spec
from cluster.ansible.inventory import load_inventory

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "provision"


def _filters() -> dict:
    spec = importlib.util.spec_from_file_location("cluster_model_filter", REPO / "playbooks/filter_plugins/cluster_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


FILTERS = _filters()


@pytest.fixture(scope="module")
def r01n01() -> dict:
    return load_inventory(REPO / "inventory" / "virtual").selected["r01n01"]


def test_eas_agent_config_is_the_golden_ius(r01n01):
    golden = yaml.safe_load((GOLDEN / "eas-agent-config-r01n01.yml").read_text())
    assert FILTERS["eas_agent_config"]("r01n01", r01n01) == golden["ius"]


def test_consul_iu_services_is_the_golden_definition(r01n01):
    # the role's default (""): the revision composed from the inventory, which pins none of its parts
    defaults = yaml.safe_load((REPO / "roles/consul_agent/defaults/main.yml").read_text())  # what the role renders
    interval, timeout = defaults["consul_agent_health_interval"], defaults["consul_agent_health_timeout"]
    definitions = FILTERS["consul_iu_services"]("r01n01", r01n01, interval, timeout, "")
    assert sorted(definitions) == ["r01n01-iu0", "r01n01-iu1"]
    assert definitions["r01n01-iu0"] == json.loads((GOLDEN / "consul-vllm-iu-r01n01-iu0.json").read_text())
    assert definitions["r01n01-iu1"]["service"]["checks"][0]["http"] == "http://127.0.1.11:8001/health"
    named = FILTERS["consul_iu_services"]("r01n01", r01n01, interval, timeout, "vllm-0.7.0-canary")
    assert {d["service"]["meta"]["revision"] for d in named.values()} == {"vllm-0.7.0-canary"}


@pytest.mark.parametrize(("given", "expected"), [({}, "^lo,docker"), ({"nccl_socket_ifname": "bond0"}, "bond0")])
def test_cluster_node_gives_the_nccl_socket_interface_with_the_spec_default(r01n01, given, expected):
    """nvidia_stack's NCCL_SOCKET_IFNAME is this value; unset, cluster/spec.py's default, which the golden
    nccl.conf files hold."""
    assert "nccl_socket_ifname" not in r01n01
    assert FILTERS["cluster_node"]("r01n01", {**r01n01, **given})["nccl_socket_ifname"] == expected
    for name in ("nccl-ib.conf", "nccl-roce.conf"):
        assert f"\nNCCL_SOCKET_IFNAME={spec.DEFAULT_NCCL_SOCKET_IFNAME}\n" in (GOLDEN / name).read_text()


def test_cluster_node_gives_the_gpu_model(r01n01):
    """nvidia_stack_nvswitch (Fabric Manager on *-sxm boards) reads it from here."""
    assert FILTERS["cluster_node"]("r01n01", r01n01)["gpu_model"] == r01n01["gpu_model"] == "h100-sxm"


@pytest.mark.parametrize(("bad", "lines"), [
    ({"iu_size": 3}, ["r01n01: iu_size=3: must be one of 1/2/4/8"]),
    ({"gpu_model": "b300"}, ["r01n01: gpu_model='b300': unknown GPU model; expected one of h100-sxm, h200-sxm, a100-sxm"]),
    ({"gpu_count": 6, "roce_gid_index": -1},
     ["r01n01: gpu_count=6: not divisible by iu_size=4: 2 GPUs left over",
      "r01n01: roce_gid_index=-1: must be a GID table index (an integer >= 0)"]),
])
@pytest.mark.parametrize("name", ["cluster_node", "eas_agent_config"])
def test_a_bad_inventory_stops_the_filter_with_one_line_per_problem(r01n01, bad, lines, name):
    """A direct ansible-playbook run is validated too: the role's first task fails, naming host/variable/value."""
    with pytest.raises(AnsibleFilterError) as error:
        FILTERS[name]("r01n01", {**r01n01, **bad})
    message = str(error.value).splitlines()
    assert message[0] == f"inventory: {len(lines)} problem(s):" and message[1:] == lines


def test_the_filters_read_no_other_variable(r01n01):
    """A vault secret the layout never needs is never touched (so never decrypted) by the filter."""

    class Watching(dict):
        def __getitem__(self, key):
            assert not key.startswith("consul_agent_acl"), key
            return super().__getitem__(key)

    FILTERS["cluster_node"]("r01n01", Watching(r01n01, consul_agent_acl_management_token="secret"))


@pytest.mark.parametrize(("given", "url"), [
    ({}, "http://127.0.1.11:8500"),
    ({"consul_scheme": "https", "consul_http_addr": "127.0.1.11:8501"}, "https://127.0.1.11:8501")])
def test_cluster_node_gives_the_consul_agent_with_its_scheme(r01n01, given, url):
    """The roles build every Consul URL from this (they wrote http:// by hand, whatever consul_scheme said)."""
    consul = FILTERS["cluster_node"]("r01n01", {**r01n01, **given})["consul"]
    assert consul["url"] == url and f"{consul['scheme']}://{consul['address']}" == url
    assert (consul["datacenter"], consul["kv_prefix"]) == ("dc1", "clusterctl/eas")


def test_cluster_node_stops_on_a_scheme_inside_the_consul_address(r01n01):
    with pytest.raises(AnsibleFilterError) as error:
        FILTERS["cluster_node"]("r01n01", {**r01n01, "consul_http_addr": "https://127.0.1.11:8501"})
    assert str(error.value).splitlines()[1] == (
        "r01n01: consul_http_addr='https://127.0.1.11:8501': HOST:PORT without a scheme: write the scheme as "
        "consul_scheme (consul_scheme: https), not in the address")


@pytest.mark.parametrize("hostile", ["$(reboot)", "quiet'", "quiet\nGRUB_TIMEOUT=0"])
def test_kernel_args_stops_the_cpu_cstates_role_on_a_non_kernel_word(hostile):
    """cpu_cstates writes these into a drop-in update-grub sources as shell, as root."""
    assert FILTERS["kernel_args"](["iommu=pt"], "r01n01") == ["iommu=pt"]
    assert FILTERS["kernel_args"]([], "r01n01") == []
    with pytest.raises(AnsibleFilterError) as error:
        FILTERS["kernel_args"](["iommu=pt", hostile], "r01n01")
    assert str(error.value).splitlines()[1].startswith(
        f"r01n01: cpu_cstates_extra_kernel_args[1]={hostile!r}: not a kernel argument")


def test_cluster_consul_is_the_same_block_from_the_consul_settings_alone(r01n01):
    """For role defaults and the Consul server the ACL tasks call, which need not be a GPU node."""
    given = {"consul_scheme": "https", "consul_http_addr": "127.0.1.11:8501", "consul_datacenter": "lab"}
    assert FILTERS["cluster_consul"]("srv", given) == FILTERS["cluster_node"]("r01n01", {**r01n01, **given})["consul"]
    assert FILTERS["cluster_consul"]("srv", {})["url"] == "http://127.0.0.1:8500"
    with pytest.raises(AnsibleFilterError) as error:
        FILTERS["cluster_consul"]("srv", {"consul_scheme": "ftp"})
    assert str(error.value).splitlines()[1:] == ["srv: consul_scheme='ftp': must be http or https"]


def test_the_ius_a_change_touches():
    spec = importlib.util.spec_from_file_location("inference_units_filter", REPO / "playbooks/filter_plugins/inference_units.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    ius = [{"index": 0, "id": "n-iu0"}, {"index": 1, "id": "n-iu1"}]

    def changed(*paths: str) -> list:
        """The filter given two registered config_files results, as the role's tasks register them."""
        written = [{"changed": bool(paths), "changes": [{"path": p, "action": "updated"} for p in paths]},
                   {"skipped": True}]  # e.g. a result without changes
        return plugin.inference_units_changed(ius, written, "/etc/vllm-iu")

    assert changed("/etc/vllm-iu/1.env") == [ius[1]]
    assert changed("/etc/systemd/system/vllm-iu@0.service.d/10-numa.conf") == [ius[0]]
    assert changed("/etc/systemd/system/vllm-iu@.service") == ius  # the template: all
    assert changed("/etc/vllm-iu/api-key.env") == ius  # the key every IU reads: all
    assert changed("/etc/chrony/chrony.conf") == [] == changed()
    assert plugin.inference_units_changed(ius, None, "/etc/vllm-iu") == []
    # vLLM installed anew under the running IUs: all of them, whatever files changed
    assert plugin.inference_units_changed(ius, None, "/etc/vllm-iu", {"changed": True}) == ius
    assert plugin.inference_units_changed(ius, None, "/etc/vllm-iu", {"changed": False}) == []
