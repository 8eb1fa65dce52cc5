"""Every validation rule has its own bad inventory: exit 2, and the message names host, variable, value."""

import json

import pytest

from tests.helpers import run_cli, write_tree
from tests.helpers.cluster import HOSTS, inline

pytestmark = pytest.mark.unit

GOOD_GROUP_VARS = "gpu_model: h100-sxm\n"


def inventory(tmp_path, hosts_yml: str, all_vars: str = GOOD_GROUP_VARS, host_vars: dict | None = None):
    files = {"hosts.yml": hosts_yml, "group_vars/all.yml": all_vars}
    for host, text in (host_vars or {}).items():
        files[f"host_vars/{host}.yml"] = text
    return str(write_tree(tmp_path, files))


ONE_RACK = HOSTS  # rack r1: n1 (127.0.77.1), n2 (127.0.77.2)

CASES = {
    "gpu_count_not_divisible": ({"n1": "gpu_count: 6\n"}, ["n1: gpu_count=6", "not divisible by iu_size=4"]),
    "iu_size_invalid": ({"n1": "iu_size: 3\n"}, ["n1: iu_size=3", "must be one of 1/2/4/8"]),
    "iu_spans_numa": (
        {"n1": "gpu_numa_nodes: [0, 0, 0, 1, 1, 1, 1, 1]\n"},
        ["n1: iu_layout=[0, 1, 2, 3]", "spans NUMA nodes [0, 1]"],
    ),
    "duplicate_ports": ({"n2": "iu_ports: [8000, 8000]\n"}, ["n2: iu_ports=8000", "duplicate IU port"]),
    "bad_netdev": (
        {"n1": "rdma_nics: [{device: mlx5_0, netdev: 'ib/p24s0'}]\n"},
        ["n1: rdma_nics[0].netdev='ib/p24s0'", "not a valid Linux interface name"],
    ),
    "netdev_too_long": (
        {"n1": "rdma_nics: [{device: mlx5_0, netdev: enp0s31f6averylongname}]\n"},
        ["n1: rdma_nics[0].netdev='enp0s31f6averylongname'"],
    ),
    "bad_rdma_device": ({"n2": "rdma_nics: [{device: 'mlx5 0'}]\n"}, ["n2: rdma_nics[0].device='mlx5 0'"]),
    # a pattern ending in `$` also matches before a trailing newline, which then reaches templates.
    "netdev_trailing_newline": (
        {"n1": 'rdma_nics: [{device: mlx5_0, netdev: "eth0\\n"}]\n'},
        ["n1: rdma_nics[0].netdev='eth0\\n'", "not a valid Linux interface name"],
    ),
    "rdma_device_trailing_newline": (
        {"n2": 'rdma_nics: [{device: "mlx5_0\\n"}]\n'}, ["n2: rdma_nics[0].device='mlx5_0\\n'"],
    ),
    "nccl_ifname_trailing_newline": (
        {"n1": 'nccl_socket_ifname: "eth0\\n"\n'}, ["n1: nccl_socket_ifname='eth0\\n'", "not a valid Linux interface"],
    ),
    "redfish_without_bmc": (
        {"n1": "cpu_cstates_redfish: true\nbmc_address: 127.0.77.101\n"},
        ["n1: bmc_username: ", "n1: bmc_password: ", "cpu_cstates_redfish is on"],
    ),
    "unknown_gpu_model": ({"n2": "gpu_model: b200\n"}, ["n2: gpu_model='b200'", "unknown GPU model"]),
    "layout_gpu_twice": (
        {"n1": "iu_layout: [[0, 1, 2, 3], [3, 4, 5, 6]]\n"},
        # the layout, not the GPU index alone ("iu_layout=3")
        ["n1: iu_layout=[[0, 1, 2, 3], [3, 4, 5, 6]]: IU 1: GPU 3 is already in another IU"],
    ),
    "layout_gpu_out_of_range": (
        {"n1": "iu_layout: [[0, 1, 2, 3], [4, 5, 6, 9]]\n"},
        ["n1: iu_layout=[[0, 1, 2, 3], [4, 5, 6, 9]]: IU 1: GPU 9 is out of range 0..7"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_rule_reports_host_variable_value(tmp_path, capsys, case):
    host_vars, expected = CASES[case]
    inv = inventory(tmp_path, ONE_RACK, host_vars=host_vars)
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", inv)
    assert code == 2, err
    for fragment in expected:
        assert fragment in err
    # the same inventory is refused by every command that loads the model, before contacting any host
    code, _, err2 = run_cli(capsys, "inventory", "show", "-i", inv)
    assert code == 2 and expected[0] in err2


def test_missing_required_variable(tmp_path, capsys):
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, ONE_RACK, all_vars="site_x: 1\n"))
    assert code == 2
    # one line for the one mistake both hosts share, naming both (not one line per host)
    assert "n1, n2 (2 hosts): gpu_model: missing required variable" in err
    assert "2 problems (1 distinct)" in err


def test_duplicate_addresses_name_both_hosts(tmp_path, capsys):
    hosts = ONE_RACK.replace("127.0.77.2", "127.0.77.1")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, hosts))
    assert code == 2
    assert "n1: ansible_host='127.0.77.1': address also used by n2" in err
    assert "n2: ansible_host='127.0.77.1': address also used by n1" in err


SECRET = "3f0c9a7e-shared-eas-token-never-printed"


@pytest.mark.parametrize(("all_vars", "host_vars", "shared"), [
    # one plain token in group_vars, every node inherits it
    (GOOD_GROUP_VARS + f"eas_agent_consul_token: {SECRET}\n", {}, "eas_agent_consul_token"),
    # one vault value in group_vars (an easy mistake in a sample inventory): same ciphertext
    (GOOD_GROUP_VARS + inline("eas_agent_consul_token", SECRET), {}, "eas_agent_consul_token"),
    # the same secret pasted into two host_vars
    (GOOD_GROUP_VARS, {h: f"consul_agent_acl_agent_token: {SECRET}\n" for h in ("n1", "n2")},
     "consul_agent_acl_agent_token"),
])
def test_a_node_token_shared_by_nodes_is_refused_without_printing_it(tmp_path, capsys, all_vars, host_vars, shared):
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, ONE_RACK, all_vars, host_vars))
    assert code == 2, err
    assert f"n1, n2 (2 hosts): {shared}: the same token on 2 hosts (n1, n2): Consul links it to one node's policy" in err
    assert SECRET not in err


@pytest.mark.parametrize(("all_vars", "host_vars"), [
    # a template is per host by construction (the virtual inventory's: inventory_hostname | to_uuid)
    (GOOD_GROUP_VARS + "eas_agent_consul_token: \"{{ ('eas:' ~ inventory_hostname) | to_uuid }}\"\n", {}),
    (GOOD_GROUP_VARS, {"n1": inline("eas_agent_consul_token", "a"), "n2": inline("eas_agent_consul_token", "b")}),
    (GOOD_GROUP_VARS + "eas_agent_consul_token: ''\n", {}),  # unset: the role's own check says so
])
def test_per_node_or_templated_tokens_pass(tmp_path, capsys, all_vars, host_vars):
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, ONE_RACK, all_vars, host_vars))
    assert code == 0 and "OK (2 hosts)" in out, err


def test_host_in_no_rack_and_in_two_racks(tmp_path, capsys):
    hosts = ONE_RACK + """
    rack_r2:
      hosts:
        n2:
    spare:
      hosts:
        n3: {ansible_host: 127.0.77.3}
"""
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, hosts))
    assert code == 2
    assert "n2: rack=['r1', 'r2']: host is in more than one rack" in err
    assert "n3: rack: host is in no rack" in err
    assert "None" not in err  # an unset variable has no value to show


def test_all_problems_are_reported_at_once(tmp_path, capsys):
    host_vars = {"n1": "iu_size: 3\nrdma_nics: [{device: mlx5_0, netdev: 'a b'}]\n", "n2": "gpu_count: 6\n"}
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, ONE_RACK, host_vars=host_vars))
    assert code == 2
    assert "n1: iu_size=3" in err and "n1: rdma_nics[0].netdev='a b'" in err and "n2: gpu_count=6" in err
    assert "3 problems" in err


def test_valid_inventory_passes(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, ONE_RACK))
    assert code == 0 and "OK (2 hosts)" in out


@pytest.mark.parametrize("name", ["../../escaped", "a/b", ".hidden", "-rf", "a..b", "n1 x", "n1\n", "x" * 64 + ".y" * 95])
def test_a_host_name_that_is_not_a_host_name_is_refused(tmp_path, capsys, name):
    """host names become IU ids, Consul service and node names and file
    names on the node (/etc/consul.d/vllm-iu-<node>-iu<i>.json), so only DNS names get that far."""
    hosts = ONE_RACK.replace("n2: {ansible_host: 127.0.77.2}", f"{json.dumps(name)}: {{ansible_host: 127.0.77.2}}")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, hosts))
    assert code == 2, err
    assert f"inventory_hostname={name!r}" in err and "not a valid host name" in err


@pytest.mark.parametrize("name", ["r01n01", "gpu-node-7.dc1.example.com", "127.0.77.9", "N1"])
def test_dns_host_names_and_addresses_are_accepted(tmp_path, capsys, name):
    hosts = ONE_RACK.replace("n2: {ansible_host: 127.0.77.2}", f"{name}: {{ansible_host: 127.0.77.2}}")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, hosts))
    assert code == 0, err


def test_a_group_level_problem_is_one_line_not_one_per_host():
    from cluster.validate import Problem, problem_lines

    problems = [Problem(f"r0{r}n0{n}", "gpu_count", 6, "not divisible by iu_size=4") for r in (1, 2) for n in (1, 2)]
    problems.append(Problem("r01n01", "iu_size", "four", "must be one of 1/2/4/8"))
    assert problem_lines(problems) == [
        "r01n01, r01n02, r02n01, ... (+1) (4 hosts): gpu_count=6: not divisible by iu_size=4",
        "r01n01: iu_size='four': must be one of 1/2/4/8",
    ]


@pytest.mark.parametrize("token", ["s3cr3t-mgmt", "0c4d5e6f7a8b4c9d8e0f1a2b3c4d5e6f", "0c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f\n"])
def test_a_management_token_that_is_no_uuid_is_refused_without_printing_it(tmp_path, capsys, token):
    """Consul's ACL bootstrap, which the role runs with this token, takes only a UUID."""
    all_vars = GOOD_GROUP_VARS + f"consul_agent_acl_management_token: {json.dumps(token)}\n"
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, ONE_RACK, all_vars))
    assert code == 2, err
    assert "consul_agent_acl_management_token: not a UUID" in err and token.strip() not in err


@pytest.mark.parametrize("value", [
    "0c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f", "\"{{ 'management' | to_uuid }}\"", "''",
    "management\nconsul_agent_acl_enabled: false"])
def test_a_uuid_a_vault_value_or_a_template_passes(tmp_path, capsys, value):
    for all_vars in (GOOD_GROUP_VARS + f"consul_agent_acl_management_token: {value}\n",
                     GOOD_GROUP_VARS + inline("consul_agent_acl_management_token", "management")):
        code, out, err = run_cli(capsys, "inventory", "validate", "-i", inventory(tmp_path, ONE_RACK, all_vars))
        assert code == 0 and "OK (2 hosts)" in out, err
