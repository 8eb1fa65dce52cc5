from pathlib import Path

import pytest

from preflight.parsers import ParseError, topo

DIR = Path(__file__).resolve().parents[2] / "fixtures" / "preflight" / "topo"


def load(name: str) -> topo.Topology:
    return topo.parse((DIR / name).read_text())


def test_h100_driver535_nic_legend_maps_nic_columns_to_devices():
    t = load("h100-sxm-hgx-driver535-nic-legend.txt")
    assert [g.name for g in t.gpus] == [f"GPU{i}" for i in range(8)]
    assert t.gpus[0].to_json() == {"name": "GPU0", "cpu_affinity": "0-55,112-167", "numa_affinity": "0",
                                   "gpu_numa_id": "N/A"}
    assert t.gpus[7].numa_affinity == "1" and t.gpus[7].cpu_affinity == "56-111,168-223"
    assert [(n.name, n.device) for n in t.nics][:2] == [("NIC0", "mlx5_0"), ("NIC1", "mlx5_1")]
    assert len(t.nics) == 10 and t.nic_by_device("mlx5_9").name == "NIC9"
    assert t.link("GPU0", "GPU0") == "X" and t.link("GPU0", "GPU5") == "NV18"
    assert t.link("GPU0", "NIC0") == "PIX" and t.link("NIC0", "GPU0") == "PIX" and t.link("GPU0", "NIC6") == "SYS"
    assert set(t.links) == {f"GPU{i}" for i in range(8)} | {f"NIC{i}" for i in range(10)}


def test_a100_driver470_names_nics_by_device_and_has_no_gpu_numa_id_column():
    t = load("a100-sxm4-dgx-driver470-mlx-columns.txt")
    assert [(n.name, n.device) for n in t.nics][:3] == [("mlx5_0", "mlx5_0"), ("mlx5_1", "mlx5_1"), ("mlx5_2", "mlx5_2")]
    assert t.gpus[0].to_json() == {"name": "GPU0", "cpu_affinity": "48-63,176-191", "numa_affinity": "3",
                                   "gpu_numa_id": None}
    assert [g.numa_affinity for g in t.gpus] == ["3", "3", "1", "1", "7", "7", "5", "5"]
    assert t.link("GPU0", "mlx5_0") == "PXB" and t.link("GPU3", "GPU4") == "NV12"


def test_old_driver_tabs_cpu_affinity_only():
    t = load("v100-sxm2-dgx1-driver418-tabs-cpu-affinity-only.txt")
    assert t.gpus[0].cpu_affinity == "0-19,40-59" and t.gpus[0].numa_affinity is None
    assert t.gpus[0].gpu_numa_id is None
    assert t.link("GPU0", "GPU3") == "NV2" and t.link("GPU0", "GPU5") == "SYS" and t.link("GPU0", "mlx5_0") == "PIX"
    assert t.link("mlx5_0", "mlx5_0") == "X"


def test_tab_separated_driver550_with_empty_cell_before_gpu_numa_id():
    t = load("h200-sxm-hgx-driver550-tabs.txt")
    assert t.gpus[4].to_json() == {"name": "GPU4", "cpu_affinity": "48-95,144-191", "numa_affinity": "1",
                                   "gpu_numa_id": "N/A"}
    assert len(t.nics) == 8 and t.nics[7].device == "mlx5_7"


def test_mp_matrix_has_pcie_paths_only():
    t = load("h100-sxm-hgx-driver535-mp.txt")
    gpu_links = {t.link(a.name, b.name) for a in t.gpus for b in t.gpus if a != b}
    assert gpu_links == {"NODE", "SYS"}


def test_a100_pcie_bridge_pairs():
    t = load("a100-pcie-nvlink-bridge-driver525.txt")
    assert t.link("GPU0", "GPU1") == "NV12" and t.link("GPU1", "GPU2") == "SYS" and t.link("GPU2", "mlx5_1") == "PXB"


def test_ansi_colour_and_crlf_parse_like_the_plain_output():
    assert load("h100-sxm-driver535-ansi-crlf.txt") == load("h100-sxm-hgx-driver535-nic-legend.txt")


def test_two_pastes_reads_the_last_complete_matrix():
    t = load("two-pastes-second-cut-short.txt")
    assert t == load("a100-pcie-nvlink-bridge-driver525.txt")


def test_truncated_matrix_names_the_last_row_read():
    with pytest.raises(ParseError) as info:
        load("truncated-mid-table.txt")
    assert info.value.line_no == 10 and info.value.line.startswith("NIC0")
    assert "NIC1" in info.value.message


def test_garbage_names_the_first_line():
    with pytest.raises(ParseError) as info:
        load("garbage-driver-not-loaded.txt")
    assert info.value.line_no == 1 and "NVIDIA-SMI has failed" in info.value.line


def test_row_with_missing_cells_is_an_error():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\nGPU1\tNV4\n"
    with pytest.raises(ParseError) as info:
        topo.parse(text)
    assert info.value.line_no == 3


def test_single_gpu_matrix():
    t = topo.parse("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\t0\n")
    assert t.to_json() == {"gpus": [{"name": "GPU0", "cpu_affinity": "0-15", "numa_affinity": "0",
                                     "gpu_numa_id": None}], "nics": [], "links": {"GPU0": {"GPU0": "X"}}}


def test_nvlink_counts_and_link_kinds_come_from_the_parser():
    """The NV# tokens are read here, not in the gpu_topology check: counts per GPU pair (0 over PCIe) and
    each link's kind."""
    t = load("v100-sxm2-dgx1-driver418-tabs-cpu-affinity-only.txt")
    assert t.nvlinks("GPU0", "GPU3") == 2 and t.nvlinks("GPU0", "GPU5") == 0 and t.nvlinks("GPU0", "GPU99") == 0
    assert [t.link_kind("GPU0", c) for c in ("GPU0", "GPU3", "GPU5", "mlx5_0", "GPU99")] == [
        "self", "nvlink", "pcie", "pcie", None]
    matrix = t.nvlink_matrix()
    assert matrix["GPU0"]["GPU3"] == 2 and matrix["GPU3"]["GPU0"] == 2 and "GPU0" not in matrix["GPU0"]
    assert set(matrix) == {g.name for g in t.gpus} and "mlx5_0" not in matrix["GPU0"]


def test_nic_without_legend_has_no_device():
    t = topo.parse("\tGPU0\tNIC0\tCPU Affinity\nGPU0\t X \tPIX\t0-15\nNIC0\tPIX\t X \n")
    assert t.nics[0].to_json() == {"name": "NIC0", "device": None}


def test_gpu_helpers():
    t = load("a100-sxm4-dgx-driver470-mlx-columns.txt")
    assert (t.gpu("GPU4").index, t.gpu("GPU4").numa_node) == (4, 7)
    assert load("v100-sxm2-dgx1-driver418-tabs-cpu-affinity-only.txt").gpu("GPU0").numa_node is None
    assert t.gpu("GPU9") is None


def test_a_row_whose_cells_ran_together_is_reported_and_no_fact_is_taken_from_it():
    topology = load("h200-sxm-hgx-driver550-tabs-lost-tab.txt")
    whole = load("h200-sxm-hgx-driver550-tabs.txt")
    assert [w.split(":")[0] for w in topology.warnings] == ["line 5", "line 7"]
    assert "row GPU3 has 18 cells, expected 19" in topology.warnings[0]
    assert "row GPU5 has 'NV18NV18' where a link token belongs" in topology.warnings[1]
    assert [g.name for g in topology.gpus] == [g.name for g in whole.gpus]
    assert topology.gpu("GPU3") == topo.TopoGpu("GPU3", None, None, None)  # not the shifted NUMA column
    assert "GPU3" not in topology.links and "GPU5" not in topology.links
    # a pair is read from the other device's row (the matrix is symmetric)
    assert topology.link("GPU3", "GPU2") == "NV18" and topology.nvlinks("GPU5", "GPU6") == 18
    assert topology.token("GPU3", "NIC3") == "PIX"
    assert {g.name: g for g in topology.gpus if g.name not in ("GPU3", "GPU5")} == {
        g.name: g for g in whole.gpus if g.name not in ("GPU3", "GPU5")}


@pytest.mark.parametrize("row, problem", [
    ("GPU1\tNV18\t X \tNV180-47,96-143\t0\t\tN/A", "has 'NV180-47,96-143' where a link token belongs"),
    ("GPU1\tNV18\t X \tNV18\t0-47,96-1430", "has 4 cells, expected 5"),
    ("GPU1\tNV18\t X \tNV18\t0-47,96-143\t0\tN/A", "has 6 cells, expected 5"),
])
def test_a_gpu_row_with_the_wrong_cell_count_is_damaged_not_read(row, problem):
    text = ("\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n"
            "GPU0\t X \tNV18\tNV18\t0-47,96-143\t0\n" + row + "\n"
            "GPU2\tNV18\tNV18\t X \t0-47,96-143\t0\n")
    topology = topo.parse(text)
    assert topology.warnings == (f"line 3: row GPU1 {problem} (cells run together?): no facts taken from it",)
    assert "GPU1" not in topology.links and topology.gpu("GPU1").cpu_affinity is None


def test_a_row_cut_short_is_still_a_truncated_output():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-47\nGPU1\tNV18\n"
    with pytest.raises(ParseError, match="row GPU1 has 1 cells, expected 2"):
        topo.parse(text)
