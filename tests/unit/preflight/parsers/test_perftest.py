from pathlib import Path

import pytest

from preflight.parsers import ParseError, perftest

pytestmark = pytest.mark.unit

DIR = Path(__file__).resolve().parents[3] / "fixtures" / "preflight" / "perftest"


def load(name: str) -> perftest.PerftestResult:
    return perftest.parse((DIR / name).read_text())


def test_write_latency_with_percentile_columns():
    r = load("h100-ndr-ib_write_lat-perftest23.txt")
    assert (r.test, r.kind, r.device, r.link_type) == ("ib_write_lat", "lat", "mlx5_0", "IB")
    assert r.to_json() == {"test": "ib_write_lat", "rows": [
        {"bytes": 2, "iterations": 1000, "t_min_us": 0.98, "t_max_us": 3.51, "t_typical_us": 1.02,
         "t_avg_us": 1.03, "t_stdev_us": 0.05, "p99_us": 1.21, "p999_us": 3.51}]}


def test_read_latency():
    r = load("a100-hdr-ib_read_lat-perftest4.5.txt")
    assert (r.test, r.rows[0].t_typical_us, r.rows[0].p999_us) == ("ib_read_lat", 1.76, 5.02)


def test_send_latency_sweep_over_roce():
    r = load("roce-cx7-200g-ib_send_lat-sweep.txt")
    assert r.test == "ib_send_lat" and r.link_type == "Ethernet"
    assert [row.bytes for row in r.rows] == [2 ** i for i in range(1, 13)]


def test_old_perftest_has_three_latency_columns():
    row = load("v100-edr-ib_write_lat-perftest3.4-old-columns.txt").rows[0]
    assert (row.t_min_us, row.t_max_us, row.t_typical_us) == (0.85, 5.32, 0.88)
    assert (row.t_avg_us, row.t_stdev_us, row.p99_us, row.p999_us) == (None, None, None, None)


def test_write_bandwidth_in_gbits():
    r = load("h100-ndr-ib_write_bw-report-gbits.txt")
    assert r.to_json() == {"test": "ib_write_bw", "rows": [
        {"bytes": 65536, "iterations": 5000, "bw_peak": 392.95, "bw_avg": 392.41, "msg_rate_mpps": 0.748466,
         "bw_unit": "Gb/sec"}]}
    assert r.rows[0].bw_avg_gbps == 392.41


def test_read_bandwidth_in_mbytes_converts_to_gbits():
    row = load("a100-hdr-ib_read_bw-mbsec.txt").rows[0]
    assert (row.bw_unit, row.bw_avg) == ("MB/sec", 23505.11)
    assert round(row.bw_avg_gbps, 1) == 197.2


def test_send_bandwidth_sweep():
    r = load("roce-cx6dx-100g-ib_send_bw-sweep-gbits.txt")
    assert r.test == "ib_send_bw" and len(r.rows) == 23 and r.rows[-1].bytes == 8388608
    assert {row.bw_unit for row in r.rows} == {"Gb/sec"}


def test_duration_mode_peak_zero():
    row = load("roce-ib_write_bw-duration-peak-zero.txt").rows[0]
    assert (row.bw_peak, row.bw_avg, row.iterations) == (0.0, 11617.09, 664644)


def test_truncated_after_header_names_the_header_line():
    with pytest.raises(ParseError) as info:
        load("truncated-after-header.txt")
    assert info.value.line.strip().startswith("#bytes")


def test_could_not_connect_names_the_error_line():
    with pytest.raises(ParseError) as info:
        load("garbage-could-not-connect.txt")
    assert "Unable to init the socket connection" in info.value.line


def test_glued_columns_name_the_row():
    with pytest.raises(ParseError) as info:
        load("broken-rxe-glued-columns-row.txt")
    assert "2465.901216.65" in info.value.line and "expected 9" in info.value.message


def test_table_without_title_has_no_test_name():
    text = (" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
            " 1024       1000             0.00               920.13 \t\t   0.942218\n" + "-" * 87 + "\n")
    r = perftest.parse(text)
    assert r.test is None and r.rows[0].bw_avg == 920.13


def test_last_complete_run_wins():
    lat = (DIR / "h100-ndr-ib_write_lat-perftest23.txt").read_text()
    bw = (DIR / "h100-ndr-ib_write_bw-report-gbits.txt").read_text()
    assert perftest.parse(lat + bw).test == "ib_write_bw"
    assert perftest.parse(bw + lat).test == "ib_write_lat"
    assert perftest.parse(bw + (DIR / "truncated-after-header.txt").read_text()).test == "ib_write_bw"


def test_non_finite_value_is_a_parse_error():
    text = (DIR / "h100-ndr-ib_write_bw-report-gbits.txt").read_text().replace("392.41", "inf")
    with pytest.raises(ParseError) as info:
        perftest.parse(text)
    assert "finite" in info.value.message
