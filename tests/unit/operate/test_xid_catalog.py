"""The XID catalogue: the shipped file against NVIDIA's buckets, the strict reader's one-line errors, and the
unit's latest XID read from a score body into the first rung."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from operate.xid_catalog import (
    BUCKET_RUNG,
    CATALOG_FILE,
    CatalogError,
    first_rung,
    load_catalog,
    parse_catalog,
    xid_last,
)

pytestmark = pytest.mark.unit

SHIPPED = yaml.safe_load(CATALOG_FILE.read_text())


def test_the_shipped_catalogue_sends_each_fault_to_the_rung_nvidia_names():
    catalog = load_catalog()
    rungs = {xid: catalog.row(xid).rung for xid in (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95, 119)}
    assert rungs == {13: "restart", 31: "restart", 43: "restart", 48: "gpu_reset", 63: "gpu_reset", 64: "gpu_reset",
                     74: "gpu_reset", 79: "reboot", 92: "restart", 94: "restart", 95: "gpu_reset", 119: "gpu_reset"}
    assert catalog.row(79).bucket == "RESTART_BM" and catalog.row(79).mnemonic.endswith("FALLEN_OFF_THE_BUS")
    assert catalog.source == "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
    # every row whose rung is not its bucket's own says why, and cites NVIDIA when it follows another page
    for row in catalog.rows.values():
        assert BUCKET_RUNG.get(row.bucket) == row.rung or row.note, row


def broken(change) -> dict:
    data = copy.deepcopy(SHIPPED)
    change(data)
    return data


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["xids"][0].update(rung="reinstall"),
     "cat.yml: xids[0] (XID 8).rung: expected one of restart, gpu_reset, reboot, repair (got 'reinstall')"),
    (lambda d: d["xids"][0].update(bucket="RESTART_GPU"),
     "cat.yml: xids[0] (XID 8).bucket: not one of NVIDIA's buckets this catalogue knows (RESTART_APP, RESET_GPU, "
     "RESTART_BM, CONTACT_SUPPORT, IGNORE, WORKFLOW_XID_45, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR) (got 'RESTART_GPU')"),
    (lambda d: d["xids"][0].update(rung="reboot"),
     "cat.yml: xids[0] (XID 8).note: missing: the rung 'reboot' is not the bucket's (RESTART_APP is restart); say why"),
    (lambda d: d["xids"].append({"xid": 13, "mnemonic": "X", "bucket": "RESTART_APP", "rung": "restart"}),
     "(XID 13).xid: listed twice (got 13)"),
    (lambda d: d["xids"][0].update(xid="79"), "cat.yml: xids[0].xid: expected an integer in [1, 4294967295] (got '79')"),
    (lambda d: d["xids"][0].update(xid=True), "xids[0].xid: expected an integer in [1, 4294967295] (got True)"),
    (lambda d: d["xids"][0].update(action="reboot"), "xids[0].action: unknown field; expected one of bucket, mnemonic"),
    (lambda d: d["xids"][0].pop("bucket"), "cat.yml: xids[0].bucket: missing"),
    (lambda d: d.update(source="https://example.org/xids"), "cat.yml: source: expected NVIDIA's Xid catalog page"),
    (lambda d: d.update(xids=[]), "cat.yml: xids: expected a list of rows (got [])"),
])
def test_a_bad_row_is_one_line_naming_the_file_the_row_and_the_field(change, message):
    with pytest.raises(CatalogError) as caught:
        parse_catalog(broken(change), "cat.yml")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_an_unreadable_or_invalid_file_is_a_usage_error(tmp_path):
    with pytest.raises(CatalogError, match=r"cannot read the XID catalogue"):
        load_catalog(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("xids: [\n")
    with pytest.raises(CatalogError, match=r"bad.yml: not valid YAML"):
        load_catalog(bad)


def body(iu: str, components: dict) -> str:
    return json.dumps({"node": "n1", "ts": 1.0, "ius": {iu: {"score": 1.0, "status": "critical",
                                                             "components": components}}})


def test_the_latest_xid_comes_from_the_units_entry_in_its_score_body():
    assert xid_last(body("n1-iu0", {"xid_events": 3, "xid_last": 79}), "n1-iu0") == (
        79, "xid_last 79 in its score body (3 events)")
    assert xid_last(body("n1-iu0", {"xid_events": 0}), "n1-iu0")[0] is None
    assert xid_last(body("n1-iu1", {"xid_last": 79}), "n1-iu0") == (
        None, "its node's score body has no entry for n1-iu0")
    assert xid_last(None, "n1-iu0") == (None, "no score body for its node in Consul")
    assert xid_last("{not json", "n1-iu0") == (None, "its node's score body is not JSON")
    # out of the declared range: dropped when read, as every reader of the body drops it
    assert xid_last(body("n1-iu0", {"xid_last": -5}), "n1-iu0")[0] is None


def at(ts: float, xid_last_at: float | None) -> str:
    components = {"xid_events": 1, "xid_last": 95, **({} if xid_last_at is None else {"xid_last_at": xid_last_at})}
    return json.dumps({"node": "n1", "ts": ts, "ius": {"n1-iu0": {"score": None, "status": "critical",
                                                                  "components": components}}})


def test_an_xid_counts_only_while_younger_than_the_window_aged_on_the_agents_clock():
    # received 100 s before the body (agent's clock), the body read 20 s after its ts (this clock)
    assert xid_last(at(5000.0, 4900.0), "n1-iu0", now=5020.0, max_age_s=3600) == (
        95, "xid_last 95 in its score body, received 120 s ago (1 events)")
    # an agent clock 1000 s ahead of this one: the age is still the agent's own 100 s plus the body's 0
    assert xid_last(at(6000.0, 5900.0), "n1-iu0", now=5020.0, max_age_s=3600)[0] == 95
    assert xid_last(at(5000.0, 4900.0), "n1-iu0", now=5020.0, max_age_s=119) == (
        None, "its xid_last 95 was received 120 s ago, more than 119 s (--xid-max-age-s): too old to say what "
              "is wrong now")
    # no xid_last_at (an agent that does not send it), or no clock given: the XID counts, as it always did
    assert xid_last(at(5000.0, None), "n1-iu0", now=1e9) == (95, "xid_last 95 in its score body (1 events)")
    assert xid_last(at(5000.0, 10.0), "n1-iu0")[0] == 95


def test_the_first_rung_names_where_it_came_from():
    catalog = load_catalog()
    assert first_rung(catalog, 79, "xid_last 79") == (
        "reboot", "reboot: xid_last 79: XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, NVIDIA's immediate action "
                  "RESTART_BM")
    assert first_rung(catalog, None, "no score body") == ("restart", "restart: no score body")
    rung, why = first_rung(catalog, 999, "xid_last 999")
    assert rung == "restart" and why.endswith("XID 999 is not in the catalogue (" + str(CATALOG_FILE) + ")")
