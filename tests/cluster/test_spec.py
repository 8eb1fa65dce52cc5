"""cluster/spec.py: one declaration per host variable (type, default, rule), one coerce() giving the typed
record that node settings are built from, every problem at once naming host, variable and value."""

from __future__ import annotations

import dataclasses

import pytest

from cluster import spec
from cluster.settings import node_settings
from tests.cluster.test_settings import HOSTS  # one host n1 in rack r1
from tests.helpers import run_cli, write_tree


def test_every_variable_is_declared_once_with_its_default_and_coercer():
    fields = dataclasses.fields(spec.HostVars)
    assert spec.NAMES == tuple(f.name for f in fields) and len(set(spec.NAMES)) == len(spec.NAMES)
    assert all(callable(f.metadata["coerce"]) for f in fields)
    assert spec.SECRETS == ("consul_token",)
    assert set(spec.PIN_VARS.values()) <= set(spec.NAMES)
    assert set(spec.LAYOUT_NAMES) | set(spec.SETTING_NAMES) == set(spec.NAMES)
    assert not set(spec.LAYOUT_NAMES) & set(spec.SETTING_NAMES)
    defaults = spec.coerce({"gpu_model": "h100-sxm"}, "n1")
    assert (defaults.gpu_count, defaults.iu_size, defaults.roce_gid_index, defaults.consul_scheme) == (8, 4, 3, "http")
    assert spec.DEFAULTS["ansible_ssh_common_args"] == () and defaults.preflight_version_pins == {}


def test_coerce_types_what_is_set():
    record = spec.coerce({"gpu_model": "h200-sxm", "gpu_count": "8", "ansible_port": "2222", "ansible_ssh_extra_args": "-o 'ProxyJump=a b'",
                          "preflight_version_pins": {"cuda": 12.4, "nccl": None}, "roce_gid_index": "1",
                          "nvidia_stack_driver_version": 550}, "n1")
    assert record.ansible_port == 2222 and record.roce_gid_index == 1 and record.gpu_count == 8
    assert record.ansible_ssh_extra_args == ("-o", "ProxyJump=a b")
    assert record.preflight_version_pins == {"cuda": "12.4"} and record.nvidia_stack_driver_version == "550"
    assert node_settings(record).version_pins == {"cuda": "12.4", "driver": "550", "fabric_manager": "550"}


def test_coerce_reports_every_problem_at_once_one_line_each():
    with pytest.raises(spec.SpecError) as caught:
        spec.coerce({"gpu_count": 0, "ansible_port": 0, "consul_scheme": "ftp", "ansible_ssh_common_args": ["-o"],
                     "preflight_version_pins": {"drivr": "550", "cud": "12"}}, "n1")
    assert str(caught.value).splitlines() == [
        "n1: gpu_model: missing required variable (one of h100-sxm, h200-sxm, a100-sxm)",
        "n1: gpu_count=0: must be a positive integer",
        "n1: ansible_port=0: not a TCP port number",
        "n1: ansible_ssh_common_args=['-o']: must be a string of ssh options",
        "n1: consul_scheme='ftp': must be http or https",
        "n1: preflight_version_pins.drivr='550': unknown component; expected one of driver, cuda, fabric_manager, "
        "nccl, ofed",
        "n1: preflight_version_pins.cud='12': unknown component; expected one of driver, cuda, fabric_manager, "
        "nccl, ofed",
    ]


KERNEL_ARG_PROBLEM = ("not a kernel argument: one word of letters, digits and _ . , = : / + - (no spaces, quotes, "
                      "'$' or newlines: update-grub sources it as shell)")


@pytest.mark.parametrize("hostile", ["$(reboot)", 'iommu=pt"', "iommu=pt\nGRUB_TIMEOUT=0", "a=1 b=2", "`id`", "x;y"])
def test_extra_kernel_args_that_are_not_one_kernel_word_are_refused(hostile):
    """They go unquoted into a grub drop-in that update-grub sources as shell, as root (security review L5)."""
    with pytest.raises(spec.SpecError) as caught:
        spec.coerce({"gpu_model": "h100-sxm", "cpu_cstates_extra_kernel_args": ["iommu=pt", hostile]}, "n1")
    assert str(caught.value) == f"n1: cpu_cstates_extra_kernel_args[1]={hostile!r}: {KERNEL_ARG_PROBLEM}"


def test_extra_kernel_args_of_kernel_shape_pass():
    args = ["iommu=pt", "intel_iommu=on", "isolcpus=1-3,5", "console=ttyS0,115200n8", "rd.driver.blacklist=nouveau",
            "root=/dev/mapper/vg-root", "nohz_full=+1"]
    assert spec.coerce({"gpu_model": "h100-sxm", "cpu_cstates_extra_kernel_args": args}, "n1"
                       ).cpu_cstates_extra_kernel_args == tuple(args)
    with pytest.raises(spec.SpecError, match=r"cpu_cstates_extra_kernel_args='iommu=pt': must be a list"):
        spec.coerce({"gpu_model": "h100-sxm", "cpu_cstates_extra_kernel_args": "iommu=pt"}, "n1")


def test_settings_of_variables_that_do_not_coerce_are_refused_not_defaulted():
    """node_settings used to read an ansible_port that is no number as "not set" (ssh's port 22) and such
    a roce_gid_index as 0; it builds from the typed record now, so the value is named instead. (Rules,
    such as a port's range, are validation's: a node built by hand may break them.)"""
    with pytest.raises(spec.SpecError, match="^n1: ansible_port='ssh': not a TCP port number$"):
        node_settings({"ansible_port": "ssh"}, "n1")
    with pytest.raises(spec.SpecError, match="roce_gid_index='three'"):
        node_settings({"roce_gid_index": "three"}, "n1")
    assert node_settings({"ansible_port": 70000}).connection.port == 70000


def test_a_misspelt_preflight_variable_is_named_with_its_file_and_near_miss(tmp_path, capsys):
    """A preflight_ variable clusterctl does not declare would be ignored silently (the overrides it
    meant to set would not apply); it is a problem naming the file, the variable and the near miss."""
    inventory = write_tree(tmp_path / "inventory", {"hosts.yml": HOSTS, "group_vars/all.yml":
                                                    "gpu_model: h100-sxm\npreflight_overides: {gpu: {count: 4}}\n"})
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", str(inventory))
    assert code == 2 and out == ""
    assert err.splitlines()[0].startswith(
        f"{inventory}: group_vars/all.yml:2: preflight_overides: unknown variable; did you mean 'preflight_overrides'?"), err


def test_the_roles_filter_still_names_a_misspelt_preflight_variable():
    """The roles' cluster_node filter sees a play's variables, not the inventory's files: its check keeps
    the preflight_ near miss."""
    problems = spec.check_settings("n1", {"preflight_overides": {}})
    assert [str(p) for p in problems] == [
        "n1: preflight_overides={}: unknown variable (clusterctl reads preflight_profile, preflight_overrides, "
        "preflight_version_pins); did you mean 'preflight_overrides'?"]


@pytest.mark.parametrize("retired", ["eas_agent_fake_gpu_file"])
def test_a_retired_variable_is_named_with_what_replaced_it(tmp_path, capsys, retired):
    """A variable clusterctl no longer reads, left in an inventory: the role no longer declares it either, so
    without this it would be ignored without a word (a virtual inventory written before the agent read its
    GPUs through the stand-in nvidia-ml-py still sets the file-reading backend's file)."""
    inventory = write_tree(tmp_path / "inventory", {"hosts.yml": HOSTS, "group_vars/all.yml":
                                                    f"gpu_model: h100-sxm\n{retired}: /run/clusterctl-sim/nvml.json\n"})
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", str(inventory))
    assert code == 2 and out == ""
    assert err.splitlines()[0] == f"{inventory}: group_vars/all.yml:2: {retired}: {spec.RETIRED[retired]}", err
    assert "no longer read" in spec.RETIRED[retired] and "remove it" in spec.RETIRED[retired]


def test_nic_numbers_that_are_not_integers_are_named_not_a_crash(tmp_path, capsys):
    """rdma_nics' port, rate_gbps, numa_node and gpu were converted with int() only when the node was
    built, after validation: `port: x` crashed `inventory show` with an internal error (ValueError)."""
    inventory = write_tree(tmp_path / "inventory", {"hosts.yml": HOSTS, "group_vars/all.yml":
                                                    "gpu_model: h100-sxm\n"
                                                    "rdma_nics: [{device: mlx5_0, port: x, numa_node: [1]}]\n"})
    code, out, err = run_cli(capsys, "inventory", "show", "-i", str(inventory))
    assert code == 2 and out == "" and "internal error" not in err
    assert err.splitlines()[1:] == ["n1: rdma_nics[0].port='x': must be an integer >= 1 (group_vars/all.yml:2)",
                                    "n1: rdma_nics[0].numa_node=[1]: must be an integer >= 0 (group_vars/all.yml:2)"], err
    with pytest.raises(spec.SpecError, match=r"^n1: rdma_nics\[0\]\.gpu=-1: must be an integer >= 0$"):
        spec.coerce({"gpu_model": "h100-sxm", "rdma_nics": [{"device": "mlx5_0", "gpu": -1}]}, "n1")


def test_the_node_is_built_from_the_coerced_record():
    from cluster.model import build_node

    node = build_node("n1", {"gpu_model": "a100-sxm", "rack": "r1", "gpu_count": "8", "iu_size": "2",
                             "rdma_nics": [{"device": "mlx5_0", "link_layer": "Ethernet", "rate_gbps": "200"}]})
    assert (node.gpu_count, node.iu_size, len(node.ius)) == (8, 2, 4)
    assert (node.nics[0].link_layer, node.nics[0].rate_gbps, node.nics[0].port) == ("ethernet", 200, 1)


def test_a_problem_names_the_value_as_the_inventory_wrote_it():
    with pytest.raises(spec.SpecError) as caught:
        spec.coerce({"gpu_model": "h100-sxm", "iu_size": "three",
                     "rdma_nics": [{"device": "mlx5 0", "link_layer": "RoCE"}]}, "n1")
    assert str(caught.value).splitlines() == [
        "n1: iu_size='three': must be one of 1/2/4/8",
        "n1: rdma_nics[0].link_layer='RoCE': must be infiniband or ethernet",
    ]  # the device name is a rule: checked once the entry is of its type
    with pytest.raises(spec.SpecError, match=r"^n1: rdma_nics\[0\]\.device='mlx5 0': not a valid RDMA device name$"):
        spec.coerce({"gpu_model": "h100-sxm", "rdma_nics": [{"device": "mlx5 0"}]}, "n1")
