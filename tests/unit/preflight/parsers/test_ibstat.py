from pathlib import Path

import pytest

from preflight.parsers import ParseError, ibstat

pytestmark = pytest.mark.unit

DIR = Path(__file__).resolve().parents[3] / "fixtures" / "preflight" / "ibstat"


def load(name: str) -> ibstat.IbStat:
    return ibstat.parse((DIR / name).read_text())


def test_ndr400_infiniband_and_roce_storage_ports():
    s = load("h100-hgx-cx7-ndr400-ib-plus-roce-storage.txt")
    assert [ca.name for ca in s.cas] == [f"mlx5_{i}" for i in range(10)]
    assert s.port("mlx5_0", 1).to_json() == {"port": 1, "state": "Active", "physical_state": "LinkUp",
                                             "rate_gbps": 400, "link_layer": "InfiniBand", "base_lid": 1201}
    assert s.port("mlx5_9", 1).link_layer == "Ethernet" and s.port("mlx5_9", 1).rate_gbps == 200
    assert s.ca("mlx5_0").ca_type == "MT4129" and s.ca("mlx5_0").firmware_version == "28.39.1002"


def test_hdr200_with_a_port_down_polling():
    s = load("a100-dgx-cx6-hdr200-one-port-down-polling.txt")
    down = s.port("mlx5_5", 1)
    assert (down.state, down.physical_state, down.rate_gbps, down.base_lid) == ("Down", "Polling", 10, 65535)
    assert {s.port(f"mlx5_{i}", 1).rate_gbps for i in range(8) if i != 5} == {200}


def test_roce_100g_ports_are_ethernet_with_lid_zero():
    s = load("roce-cx6dx-100g-ethernet.txt")
    assert [(p.rate_gbps, p.link_layer, p.base_lid) for ca in s.cas for p in ca.ports] == [(100, "Ethernet", 0)] * 2


def test_roce_200g_and_disabled_port():
    s = load("roce-cx7-200g-with-disabled-port.txt")
    assert s.port("mlx5_0", 1).rate_gbps == 200
    assert (s.port("mlx5_10", 1).state, s.port("mlx5_10", 1).physical_state) == ("Down", "Disabled")


def test_two_port_ca_with_ibwarn_noise():
    s = load("connectx3-fdr56-two-ports-ibwarn.txt")
    assert [(p.port, p.state, p.rate_gbps) for p in s.ca("mlx4_0").ports] == [(1, "Down", 10), (2, "Active", 56)]


def test_ibpanic_tail_is_skipped():
    s = load("a100-cx6-hdr100-ibpanic-tail.txt")
    assert [ca.name for ca in s.cas] == ["mlx5_0", "mlx5_1"] and s.port("mlx5_1", 1).base_lid == 13306


def test_truncated_inside_a_port_names_the_last_line():
    with pytest.raises(ParseError) as info:
        load("truncated-inside-port.txt")
    assert info.value.line_no == 30 and "mlx5_1" in info.value.message


def test_garbage():
    with pytest.raises(ParseError) as info:
        load("garbage-command-not-found.txt")
    assert info.value.line_no == 1


def test_repeated_output_reads_the_last_one():
    text = (DIR / "roce-cx6dx-100g-ethernet.txt").read_text()
    second = text.replace("Rate: 100", "Rate: 25")
    assert ibstat.parse(text + second).port("mlx5_0", 1).rate_gbps == 25


def test_non_numeric_rate_is_a_parse_error():
    text = (DIR / "roce-cx6dx-100g-ethernet.txt").read_text().replace("Rate: 100", "Rate: fast", 1)
    with pytest.raises(ParseError) as info:
        ibstat.parse(text)
    assert "Rate" in info.value.message and info.value.line.strip() == "Rate: fast"


def test_prompt_lines_around_the_output_are_ignored():
    text = "$ ibstat\n" + (DIR / "roce-cx6dx-100g-ethernet.txt").read_text() + "$ \n"
    assert [ca.name for ca in ibstat.parse(text).cas] == ["mlx5_0", "mlx5_1"]
