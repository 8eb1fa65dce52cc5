"""Role structure, argument specs vs defaults, the cluster_node filter and batch planning (no hosts needed)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from cluster import model
from cluster.ansible.inventory import load_inventory
from cluster.model import build_node
from cluster.spec import LAYOUT_NAMES
from provision import plan as prov

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())
EXPECTED_ROLES = [
    "chrony", "consul_agent", "cpu_cstates", "eas_agent", "eas_edge", "edge_balancer", "host_firewall",
    "inference_unit", "numa_tuning", "nvidia_stack", "rdma_network",
]


def _yaml(path: Path):
    return yaml.safe_load(path.read_text())


def _spec(role: str) -> dict:
    return _yaml(REPO / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]


def _defaults(role: str) -> dict:
    return _yaml(REPO / "roles" / role / "defaults" / "main.yml") or {}


def test_the_roles_of_the_issue_exist():
    assert ROLES == EXPECTED_ROLES


@pytest.mark.parametrize("role", ROLES)
def test_role_has_every_part(role):
    base = REPO / "roles" / role
    for part in ("defaults/main.yml", "meta/argument_specs.yml", "meta/main.yml", "tasks/main.yml",
                 "handlers/main.yml", "README.md"):
        assert (base / part).is_file(), f"{role}: {part} missing"
    assert list((base / "templates").glob("*.j2")), f"{role}: no templates"


SHARED_SETTINGS = ("clusterctl_render_only", "clusterctl_proxy_env")


@pytest.mark.parametrize("role", ROLES)
def test_spec_and_defaults_name_the_same_variables(role):
    spec, defaults = _spec(role), _defaults(role)
    assert set(spec) == set(defaults), (
        f"{role}: only in spec: {sorted(set(spec) - set(defaults))}, only in defaults: {sorted(set(defaults) - set(spec))}"
    )
    for name, option in spec.items():
        # The settings one inventory value gives every role: clusterctl_render_only (playbooks/README.md, "Render
        # only") and clusterctl_proxy_env (the site's proxy for what a role fetches itself).
        assert name.startswith(role + "_") or name in SHARED_SETTINGS, f"{role}: {name} is not role-prefixed"
        assert option.get("type"), f"{role}: {name} has no type"
        assert option.get("description"), f"{role}: {name} has no description"


@pytest.mark.parametrize("role", ROLES)
def test_literal_defaults_pass_their_own_spec(role):
    """Defaults that are not templates are validated here with Ansible's own validator."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    spec, defaults = _spec(role), _defaults(role)
    literal = {k: v for k, v in defaults.items() if "{{" not in str(v)}
    partial = {k: {**v, "required": False} for k, v in spec.items()}
    result = ArgumentSpecValidator(partial).validate(literal)
    assert not result.error_messages, result.error_messages


@pytest.mark.parametrize("role", ROLES)
def test_readme_documents_every_variable(role):
    readme = (REPO / "roles" / role / "README.md").read_text()
    missing = [name for name in _defaults(role) if name not in readme and not _documented_as_family(name, readme)]
    assert not missing, f"{role}/README.md does not mention {missing}"


def _documented_as_family(name: str, readme: str) -> bool:
    # README rows like `nvidia_stack_repo_url` / `_repo_distro` document a family of variables.
    return f"`_{name.split('_', 2)[-1]}`" in readme or any(
        f"`_{'_'.join(name.split('_')[i:])}`" in readme for i in range(2, len(name.split("_")))
    )


def test_bounds_are_in_the_specs():
    seqs = _spec("inference_unit")["inference_unit_max_num_seqs"]["choices"]
    assert seqs == list(range(1, 257))
    gmu = _spec("inference_unit")["inference_unit_gpu_memory_utilization"]["choices"]
    assert min(gmu) > 0 and max(gmu) == 0.95 and 0.9 in gmu
    # GPUs per IU (= vLLM's tensor parallel size) are the model's iu_size, checked by the cluster_node filter
    # (test_filters.py); the role has no second variable for it.
    assert "inference_unit_iu_size" not in _spec("inference_unit")
    assert model.VALID_IU_SIZES == (1, 2, 4, 8)
    intervals = _spec("consul_agent")["consul_agent_health_interval"]["choices"]
    assert max(int(i.rstrip("s")) for i in intervals) == 15
    bmc = _spec("cpu_cstates")["cpu_cstates_bmc"]
    assert bmc["required_if"] == [["redfish", True, ["address", "username", "password"]]]
    assert bmc["options"]["password"]["no_log"] is True


def test_secrets_are_no_log_in_specs():
    consul_secrets = ("gossip_key", "acl_management_token", "acl_agent_token", "acl_registration_token",
                      "acl_operator_token", "acl_eas_agent_token", "acl_edge_token", "tls_server_key_pem")
    for role, name in (*(("consul_agent", f"consul_agent_{s}") for s in consul_secrets),
                       ("eas_agent", "eas_agent_consul_token"), ("inference_unit", "inference_unit_api_key")):
        assert _spec(role)[name].get("no_log") is True
    # the agents hold no secret of the announce channel: public keys, nothing to hide
    assert not _spec("eas_agent")["eas_agent_edge_public_keys"].get("no_log")


def _filter_module():
    spec = importlib.util.spec_from_file_location("cluster_model_filter", REPO / "playbooks/filter_plugins/cluster_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Raw reads of the model's variables by a role still left (the architecture note lists them): the consul
# agent's bind address from ansible_host, cpu_cstates' Redfish switch.
RAW_MODEL_READS_LEFT = {("consul_agent", "ansible_host"), ("cpu_cstates", "cpu_cstates_redfish")}
_MODEL_NAME = re.compile(r"(?<![\w.'\"])(" + "|".join(LAYOUT_NAMES) + r")\b")
_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|^\s*(?:- )?(?:when|that|until|changed_when|failed_when):.*$")


def raw_model_reads(role_dir: Path) -> set[tuple[str, str]]:
    """(role, variable) for each model variable a role's defaults, tasks, handlers or templates read by
    its raw name in a Jinja expression instead of from the cluster_node filter's result."""
    found = set()
    for path in sorted(role_dir.rglob("*")):
        if path.suffix in (".yml", ".j2") and path.parent.name in ("defaults", "tasks", "handlers", "templates", "vars"):
            for line in path.read_text().splitlines():
                found |= {(role_dir.name, m.group(1)) for block in _JINJA.finditer(line)
                          for m in _MODEL_NAME.finditer(block.group(0))}
    return found


def test_the_roles_read_the_models_variables_through_the_filter():
    """gpu_model, nccl_socket_ifname, rdma_nics, ...: a role takes them from cluster_node (validated, with
    cluster/spec.py's defaults), never raw with a default of its own."""
    found = set().union(*(raw_model_reads(REPO / "roles" / role) for role in ROLES))
    assert found - RAW_MODEL_READS_LEFT == set()
    assert RAW_MODEL_READS_LEFT <= found  # a read fixed since: drop it from the list


def test_the_raw_read_scan_sees_each_form(tmp_path):
    (tmp_path / "defaults").mkdir()
    (tmp_path / "defaults" / "main.yml").write_text(
        "a: \"{{ (gpu_model | default('')) is search('-sxm$') }}\"\n"
        "b: \"{{ (inventory_hostname | cluster_node(hostvars[inventory_hostname])).nccl_socket_ifname }}\"\n"
        "# rdma_nics in a comment\n")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "main.yml").write_text("- name: x\n  when: iu_size | int > 1\n")
    assert raw_model_reads(tmp_path) == {(tmp_path.name, "gpu_model"), (tmp_path.name, "iu_size")}


def test_cluster_node_filter_is_the_model():
    loaded = load_inventory(REPO / "inventory" / "virtual")
    cluster_node = _filter_module().FilterModule().filters()["cluster_node"]
    for host, hostvars in loaded.selected.items():
        node = build_node(host, hostvars)
        data = cluster_node(host, hostvars)
        assert [(iu["id"], iu["gpus"], iu["numa_node"], iu["port"], iu["nics"]) for iu in data["ius"]] == [
            (iu.id, list(iu.gpus), iu.numa_node, iu.port, list(iu.nics)) for iu in node.ius
        ]
        assert data["rack"] == node.rack and data["address"] == node.address
        nic_netdev = {n.device: n.netdev for n in node.nics}
        for iu in data["ius"]:
            assert iu["netdevs"] == [nic_netdev[d] for d in iu["nics"]]


@pytest.mark.parametrize(
    ("text", "sizes"),
    [("1,10%,100%", [1, "10%", "100%"]), ("5", [5]), (" 2 , 50% ", [2, "50%"])],
)
def test_parse_batches(text, sizes):
    assert prov.parse_batches(text) == sizes


@pytest.mark.parametrize("text", ["0", "10%,x", "150%", "0%", "", "1,,2", "-1"])
def test_parse_batches_rejects(text):
    with pytest.raises(prov.BatchError):
        prov.parse_batches(text)


@pytest.mark.parametrize(
    ("count", "sizes", "expected"),
    [
        (64, [1, "10%", "50%", "100%"], [1, 6, 32, 25]),
        (4, [1, "10%", "50%", "100%"], [1, 1, 2]),
        (3, [1, "10%", "50%", "100%"], [1, 1, 1]),
        (10, [3], [3, 3, 3, 1]),
        (7, ["100%"], [7]),
    ],
)
def test_split_batches_follows_ansible_serial(count, sizes, expected):
    hosts = [f"h{i}" for i in range(count)]
    batches = prov.split_batches(hosts, sizes)
    assert [len(b) for b in batches] == expected
    assert [h for b in batches for h in b] == hosts


def test_split_batches_matches_ansible_itself():
    """Same batches as PlaybookExecutor._get_serialized_batches for the default sizes."""
    from ansible.executor.playbook_executor import PlaybookExecutor

    class _Inventory:
        def __init__(self, hosts):
            self.hosts = hosts

        def get_hosts(self, pattern, order=None):
            return list(self.hosts)

    class _Play:
        hosts, order = "all", None
        serial = list(prov.DEFAULT_BATCHES)

    for count in (1, 3, 4, 16, 64, 100):
        hosts = [f"h{i}" for i in range(count)]
        executor = PlaybookExecutor.__new__(PlaybookExecutor)
        executor._inventory = _Inventory(hosts)
        assert executor._get_serialized_batches(_Play()) == prov.split_batches(hosts, prov.DEFAULT_BATCHES)


def test_plan_uses_inventory_order_and_roles():
    plan = prov.make_plan(REPO / "inventory" / "virtual", "site.yml", None, ["inference"], prov.DEFAULT_BATCHES)
    assert plan.hosts == ("r01n01", "r01n02", "r02n01", "r02n02")
    # the Consul server (r01n01) first in a play of its own, the dedicated servers' play (none here: no batch),
    # then the batched play over every host, then the edges one at a time and the balancer (their roles not
    # tagged inference), then the servers' reboot play (tasks only: one server per batch)
    assert [list(b) for b in plan.batches] == [["r01n01"], ["r01n01"], ["r01n02"], ["r02n01", "r02n02"], ["r01n01"],
                                               ["r02n01"], ["r01n01"], ["r01n01"]]
    assert [[s.role for s in p.roles] for p in plan.plays] == [
        ["consul_agent"], [], ["inference_unit", "consul_agent", "eas_agent"], [], [], []]
    assert plan.plays[1].batches == ()


def test_a_playbook_of_one_group_plans_only_its_hosts():
    """edges.yml on the virtual inventory: the edges, then the balancer; the nodes without an edge are not
    hosts of the run (counted as never started, they would fail a run that did all it had to)."""
    plan = prov.make_plan(REPO / "inventory" / "virtual", "edges.yml", None, [], prov.DEFAULT_BATCHES)
    assert plan.hosts == ("r01n01", "r02n01")
    assert [list(b) for b in plan.batches] == [["r01n01"], ["r02n01"], ["r01n01"]]


def test_playbooks_use_batches_and_stop_on_failure():
    for path in (REPO / "playbooks").glob("*.yml"):
        for play in prov.playbook_plays(path):
            assert play.get("max_fail_percentage") is not None, f"{path.name}: no max_fail_percentage"
            if path.name in ("rolling-restart.yml", "node-reboot.yml") or play["hosts"] in ("edges", "balancers"):
                assert play["serial"] == 1  # one node, one edge, one balancer at a time (edges.yml, imported)
            elif play["name"] == "Reboot the Consul servers one at a time":  # consul-servers-reboot.yml
                assert (play["hosts"], play["serial"]) == ("consul_servers", 1)
            elif play["hosts"] == "consul_servers":  # consul-servers.yml, imported or run alone
                assert "serial" not in play  # all servers at once (tests/integration/provision/test_batches.py)
            elif play["hosts"] == "dedicated_consul_servers":  # one server at a time: the quorum stays
                assert play["serial"] == 1, path.name
            else:
                assert re.search(r"clusterctl_batches", str(play["serial"])), path.name


@pytest.mark.parametrize("pattern", ["all:!dedicated_consul_servers", "rack_r1:rack_r2:!consul_servers",
                                     "all:&consul_servers", "!rack_r1", "consul_servers:!nosuchgroup", "c1:n2:n1",
                                     "rack_r2:rack_r1"])
def test_play_hosts_follows_ansibles_own_pattern_evaluation(tmp_path, pattern):
    """The plan's hosts of a pattern are Ansible's InventoryManager.get_hosts, in the same order."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    rack_r1: {hosts: {n1: , n2: }}\n    rack_r2: {hosts: {n3: }}\n"
        "    dedicated_consul_servers: {hosts: {c1: }}\n    consul_servers: {hosts: {c1: , n3: }}\n")
    ansible = InventoryManager(loader=DataLoader(), sources=[str(tmp_path / "hosts.yml")])
    everyone = [h.name for h in ansible.get_hosts("all")]
    groups = {name: list(hosts) for name, hosts in ansible.get_groups_dict().items()}
    expected = [h.name for h in ansible.get_hosts(pattern)]
    assert prov.play_hosts(pattern, everyone, groups, everyone, "site.yml: play 1") == expected
    assert prov.play_hosts(pattern, everyone, groups, ["n1", "c1"], "x") == [h for h in expected if h in ("n1", "c1")]


@pytest.mark.parametrize("pattern", ["rack_*", "~n[0-9]", "all:!", "", "a,b"])
def test_a_pattern_the_plan_cannot_follow_is_named(pattern):
    with pytest.raises(prov.InventoryError, match="site.yml: play 2 .*: hosts .*: the plan follows hosts, groups"):
        prov.play_hosts(pattern, ["n1"], {}, ["n1"], "site.yml: play 2 (x)")
