"""The host_firewall role's rules, rendered by Ansible from the provisioning tests' virtual inventory exactly as the role renders
them, checked with ``nft -c`` as the role checks them, and loaded with real nft into a network namespace of
the test's own (never this host's: the machines share its namespace): from inside it, connections to an IU,
agent or Consul port from an edge's, a node's or a controller's address are accepted, from any other source
refused, and a port the role does not guard stays open."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

from tests.helpers import GOLDEN, REPO
from tests.helpers.provision import create_inventory

pytestmark = pytest.mark.integration

EDGE, CONTROLLER, STRANGER = "127.0.5.1", "127.0.5.2", "127.0.5.9"
NODE, OTHER_NODE = "127.0.1.11", "127.0.2.11"  # r01n01 and r02n01 of the provisioning tests' inventory
GOLDEN_RULES = "host-firewall-r01n01.nft"

PLAYBOOK = """\
- name: Render the host firewall's rules as the role does
  hosts: "{hosts}"
  gather_facts: false
  tasks:
    - name: The role's sources and ports
      ansible.builtin.include_role:
        name: host_firewall
        tasks_from: sources
        public: true
    - name: The role's templates
      ansible.builtin.template:
        src: "{{{{ item.src }}}}"
        dest: "{{{{ item.dest }}}}"
        mode: "0644"
      loop:
        - {{src: {templates}/firewall.nft.j2, dest: "{work}/{{{{ inventory_hostname }}}}-firewall.nft"}}
        - {{src: {templates}/clusterctl-firewall.service.j2, dest: {work}/clusterctl-firewall.service}}
      vars:
        ansible_managed: Ansible managed
"""


def nft() -> str:
    """The nft binary; installed from Debian's archive when missing (root only)."""
    found = shutil.which("nft") or (os.path.exists("/usr/sbin/nft") and "/usr/sbin/nft")
    if not found and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-qq", "nftables"], env=env, capture_output=True, timeout=300)
        found = shutil.which("nft") or (os.path.exists("/usr/sbin/nft") and "/usr/sbin/nft")
    if not found:
        pytest.skip("nft is not installed and cannot be (apt-get install nftables needs root)")
    return found


DEDICATED = "127.0.82.21"


def render(work, dedicated: bool = False, **variables) -> dict[str, str]:
    """The role's files for r01n01 of the provisioning tests' inventory (with ``variables`` on top), rendered by
    Ansible; ``dedicated``: with a dedicated Consul server c1 added, and its rules too (``c1-firewall.nft``)."""
    create_inventory(work / "inventory")
    if dedicated:
        hosts = work / "inventory/hosts.yml"
        hosts.write_text(hosts.read_text().replace(
            "    consul_servers:\n      hosts:\n", "    dedicated_consul_servers:\n      hosts:\n"
            f"        c1: {{ansible_host: {DEDICATED}}}\n    consul_servers:\n      hosts:\n        c1:\n"))
    (work / "play.yml").write_text(PLAYBOOK.format(templates=REPO / "roles/host_firewall/templates", work=work,
                                                   hosts="r01n01:c1" if dedicated else "r01n01"))
    extra = json.dumps({"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **variables})
    playbook = REPO / ".venv/bin/ansible-playbook"
    done = subprocess.run([str(playbook) if playbook.exists() else "ansible-playbook", "-i",
                           str(work / "inventory"), str(work / "play.yml"), "-e", extra], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {name.replace("r01n01-", ""): path.read_text() for path in work.iterdir()
            if (name := path.name).endswith((".nft", ".service"))}


@pytest.fixture(scope="module")
def rendered_with_a_dedicated_server(tmp_path_factory) -> dict[str, str]:
    """The rules with an edge and a controller added to the virtual inventory's values, and a dedicated Consul
    server's (``c1-firewall.nft``)."""
    return render(tmp_path_factory.mktemp("firewall"), dedicated=True, host_firewall_edges=[EDGE],
                  host_firewall_controllers=[f"{CONTROLLER}/32"])


@pytest.fixture(scope="module")
def rendered(rendered_with_a_dedicated_server) -> str:
    return rendered_with_a_dedicated_server["firewall.nft"]


def test_the_virtual_inventory_s_files_are_the_goldens(tmp_path):
    files = render(tmp_path)
    assert files["firewall.nft"] == (GOLDEN / GOLDEN_RULES).read_text()
    assert files["clusterctl-firewall.service"] == (GOLDEN / "clusterctl-firewall.service").read_text()


def test_the_rules_list_the_inventory_s_nodes_edges_and_ports(rendered):
    allowed = rendered.split("set allowed_v4", 1)[1].split("}", 1)[0]
    for source in ("127.0.0.1", NODE, OTHER_NODE, "127.0.1.12", DEDICATED, EDGE, f"{CONTROLLER}/32"):
        assert source in allowed
    assert STRANGER not in rendered
    tcp = rendered.split("set guarded_tcp", 1)[1].split("}", 1)[0]
    assert all(str(port) in tcp for port in (8000, 8001, 9105, 8300, 8500, 8501, 8502))


def test_nft_accepts_the_rules_in_a_namespace_of_its_own(rendered, tmp_path):
    path = tmp_path / "firewall.nft"
    path.write_text(rendered)
    check = subprocess.run(["unshare", "--user", "--map-root-user", "--net", nft(), "-c", "-f", str(path)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    path.write_text(rendered.replace("tcp dport @guarded_tcp ip saddr", "tcp dport @guarded_tcp ip saddr {"))
    broken = subprocess.run(["unshare", "--user", "--map-root-user", "--net", nft(), "-c", "-f", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert broken.returncode != 0  # the check is a real one


# Run inside the namespace: a listener per port on NODE, then one connection per (source, port).
PROBE = textwrap.dedent("""
    import json, socket, sys
    node, cases = sys.argv[1], json.loads(sys.argv[2])
    listeners = []
    for port in sorted({port for _, port in cases}):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((node, port)); s.listen(16); listeners.append(s)
    results = []
    for source, port in cases:
        c = socket.socket(); c.settimeout(2); c.bind((source, 0))
        try:
            c.connect((node, port)); results.append("accepted")
        except ConnectionRefusedError:
            results.append("refused")
        except OSError as exc:
            results.append(type(exc).__name__)
        finally:
            c.close()
    print(json.dumps(results))
""")


@pytest.fixture
def namespace():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("creating a network namespace needs root and iproute2")
    name = f"clusterctl-fw-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], timeout=30)


def test_only_edges_nodes_and_controllers_reach_the_guarded_ports(rendered, namespace, tmp_path):
    path = tmp_path / "firewall.nft"
    path.write_text(rendered)
    run = ["ip", "netns", "exec", namespace]
    cases = [(EDGE, 8000), (EDGE, 9105), (OTHER_NODE, 8500), (CONTROLLER, 8300), (NODE, 8001),
             (STRANGER, 8000), (STRANGER, 8001), (STRANGER, 9105), (STRANGER, 8500), (STRANGER, 8300),
             (STRANGER, 2222)]  # 2222: a port the role does not guard
    expected = ["accepted"] * 5 + ["refused"] * 5 + ["accepted"]

    def probe() -> list[str]:
        done = subprocess.run([*run, sys.executable, "-c", PROBE, NODE, json.dumps(cases)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert probe() == ["accepted"] * len(cases)  # without rules: everyone (the namespace starts open)
    subprocess.run([*run, nft(), "-f", str(path)], check=True, timeout=60)
    assert probe() == expected
    subprocess.run([*run, nft(), "-f", str(path)], check=True, timeout=60)  # reloading replaces, never stacks
    listed = subprocess.run([*run, nft(), "list", "tables"], capture_output=True, text=True, timeout=60).stdout
    assert listed.split() == ["table", "inet", "clusterctl_firewall"]
    assert probe() == expected


def test_a_dedicated_consul_server_guards_consul_s_ports_only(rendered_with_a_dedicated_server):
    """A host of dedicated_consul_servers (cluster.servers) runs no IU and no eas-agent: the role guards Consul's
    ports there, for the same sources (the cluster_host filter; the GPU roles' cluster_node refuses the host)."""
    rules = rendered_with_a_dedicated_server["c1-firewall.nft"]
    tcp = rules.split("set guarded_tcp", 1)[1].split("}", 1)[0].split("elements", 1)[1]
    assert sorted(int(port) for port in re.findall(r"\d+", tcp)) == [8300, 8301, 8302, 8500, 8501, 8502, 8503, 8600]
    def allowed(text: str) -> str:
        return text.split("set allowed_v4", 1)[1].split("}", 1)[0]

    assert allowed(rules) == allowed(rendered_with_a_dedicated_server["firewall.nft"])  # the nodes' own sources
