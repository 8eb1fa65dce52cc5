"""The XID catalogue: which rung of ``clusterctl remediate`` (:mod:`operate.remediate`) can first fix a unit
whose GPUs logged an XID, from NVIDIA's Xid catalog ("Resolution Bucket (Immediate Action)"), as a data file
(``operate/xid_catalog.yml``: every row, its bucket verbatim, and why where the rung is not the bucket's own).

Strict: a catalogue that is not as documented is one :class:`CatalogError` line naming the file, the row and
the field (exit 2, nothing touched), because a wrong row sends a unit to the wrong rung: a restart for a GPU
that fell off the bus wastes the verify bound, a reboot for an application error takes a whole node out.

:func:`first_rung` turns the unit's latest XID (``xid_last`` in its node's score body, read by
:func:`xid_last`) into the rung and one line saying why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.errors import UsageError
from eas_wire.scorebody import BodyError, IUScore
from operate.scenario import FieldReader, yaml_problem

CATALOG_FILE = Path(__file__).with_name("xid_catalog.yml")
# the order the ladder climbs them; fabric_reset only where it is the first (operate/remediate_board.py)
RUNGS = ("restart", "gpu_reset", "fabric_reset", "reboot", "repair")
# a row's rung: the fabric reset answers a fatal NVSwitch SXID, which no XID is
ROW_RUNGS = tuple(r for r in RUNGS if r != "fabric_reset")
# NVIDIA's buckets that name one action, and the rung that carries it out
BUCKET_RUNG = {"RESTART_APP": "restart", "RESET_GPU": "gpu_reset", "RESTART_BM": "reboot", "CONTACT_SUPPORT": "repair"}
# buckets that name no single action: a row with one must say in its note why its rung
OTHER_BUCKETS = ("IGNORE", "WORKFLOW_XID_45", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR")
NVIDIA_DOCS = "https://docs.nvidia.com/"
MAX_XID = 2**32 - 1  # NVML's event data is an unsigned int
DEFAULT_RUNG = "restart"
# An XID older than this no longer picks the first rung: an hour covers an alert being acted on; a unit's own
# (re)start is no sign the fault is gone (a GPU off the bus makes systemd restart the engine again and again).
XID_MAX_AGE_S = 3600.0
_TOP = {"source", "xids"}
_ROW = {"xid", "mnemonic", "bucket", "rung", "note"}


class CatalogError(UsageError):
    """A catalogue file that cannot be used: one line naming the file, the row and the field."""


@dataclass(frozen=True)
class Row:
    xid: int
    mnemonic: str
    bucket: str  # NVIDIA's Resolution Bucket (Immediate Action), verbatim
    rung: str
    note: str = ""


@dataclass(frozen=True)
class Catalog:
    source: str  # the NVIDIA page the buckets are from
    rows: dict[int, Row]
    path: str

    def row(self, xid: int) -> Row | None:
        return self.rows.get(xid)


def parse_catalog(data, path: str = "<catalogue>") -> Catalog:
    """The catalogue in ``data`` (decoded YAML); :class:`CatalogError` for anything not as documented."""
    read = FieldReader(path, CatalogError)
    top = read.mapping(data, "", _TOP, _TOP)
    source = read.text(top["source"], "source")
    if not source.startswith(NVIDIA_DOCS):
        raise read.fail("source", f"expected NVIDIA's Xid catalog page (a URL under {NVIDIA_DOCS})", source)
    if not isinstance(top["xids"], list) or not top["xids"]:
        raise read.fail("xids", "expected a list of rows", top["xids"])
    rows: dict[int, Row] = {}
    for number, value in enumerate(top["xids"]):
        field = f"xids[{number}]"
        row = read.mapping(value, field, _ROW, {"xid", "mnemonic", "bucket", "rung"})
        xid = read.integer(row["xid"], f"{field}.xid", 1, MAX_XID)
        field = f"xids[{number}] (XID {xid})"
        if xid in rows:
            raise read.fail(f"{field}.xid", "listed twice", xid)
        mnemonic = read.text(row["mnemonic"], f"{field}.mnemonic").strip()
        if not mnemonic:
            raise read.fail(f"{field}.mnemonic", "empty: name the XID as NVIDIA's catalog does", row["mnemonic"])
        bucket = read.text(row["bucket"], f"{field}.bucket")
        if bucket not in BUCKET_RUNG and bucket not in OTHER_BUCKETS:
            raise read.fail(f"{field}.bucket", f"not one of NVIDIA's buckets this catalogue knows "
                                               f"({', '.join([*BUCKET_RUNG, *OTHER_BUCKETS])})", bucket)
        rung = read.text(row["rung"], f"{field}.rung")
        if rung not in ROW_RUNGS:
            raise read.fail(f"{field}.rung", f"expected one of {', '.join(ROW_RUNGS)}", rung)
        note = read.text(row.get("note", ""), f"{field}.note").strip()
        if BUCKET_RUNG.get(bucket) != rung and not note:
            own = f"{bucket} is {BUCKET_RUNG[bucket]}" if bucket in BUCKET_RUNG else f"{bucket} names no single action"
            raise read.fail(f"{field}.note", f"missing: the rung {rung!r} is not the bucket's ({own}); say why")
        rows[xid] = Row(xid, mnemonic, bucket, rung, " ".join(note.split()))
    return Catalog(source, rows, path)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """The catalogue at ``path`` (None: the one shipped beside this module)."""
    path = Path(path) if path is not None else CATALOG_FILE
    try:
        text = path.read_text()
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the XID catalogue: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: {yaml_problem(exc)}") from None
    return parse_catalog(data, str(path))


def xid_last(body_text: str | None, iu: str, now: float | None = None, max_age_s: float = XID_MAX_AGE_S
             ) -> tuple[int | None, str]:
    """The unit's latest XID from its node's score body (the raw KV value) and where it came from; None with
    the reason when the body is missing, unreadable, names none for the unit, or (given ``now``, unix s on
    this machine's clock) names one received more than ``max_age_s`` ago.

    The XID's age: on the agent's clock from ``xid_last_at`` to the body's ``ts`` (both stamped by the agent,
    so exact whatever the two clocks' offset), plus the body's own age on this clock (``now - ts``, at least 0).
    A body without ``xid_last_at`` (an agent that does not send it) keeps the XID, as before the agent sent it."""
    if body_text is None:
        return None, "no score body for its node in Consul"
    try:
        body = json.loads(body_text)
    except ValueError:
        return None, "its node's score body is not JSON"
    unit = ((body.get("ius") if isinstance(body, dict) else None) or {}).get(iu)
    if not isinstance(unit, dict):
        return None, f"its node's score body has no entry for {iu}"
    try:
        terms = IUScore.from_json(unit, blank_bad_score=True).terms
    except BodyError as exc:
        return None, f"its score body entry is malformed ({exc})"
    if terms.xid_last is None:
        return None, "its score body names no XID (none seen since its agent started, or NVML gave no events)"
    xid, events = int(terms.xid_last), f"{terms.xid_events or 0:g} events"
    ts = body.get("ts")
    if now is None or terms.xid_last_at is None or not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return xid, f"xid_last {xid} in its score body ({events})"
    age = (ts - terms.xid_last_at) + max(0.0, now - ts)
    if age > max_age_s:
        return None, (f"its xid_last {xid} was received {age:.0f} s ago, more than {max_age_s:g} s "
                      f"(--xid-max-age-s): too old to say what is wrong now")
    return xid, f"xid_last {xid} in its score body, received {max(0.0, age):.0f} s ago ({events})"


def first_rung(catalog: Catalog, xid: int | None, seen: str) -> tuple[str, str]:
    """The rung to start at and one line saying why (``seen``: where ``xid`` came from)."""
    if xid is None:
        return DEFAULT_RUNG, f"{DEFAULT_RUNG}: {seen}"
    row = catalog.row(xid)
    if row is None:
        return DEFAULT_RUNG, f"{DEFAULT_RUNG}: {seen}; XID {xid} is not in the catalogue ({catalog.path})"
    why = f"; {row.note}" if row.note else ""
    return row.rung, f"{row.rung}: {seen}: XID {xid} {row.mnemonic}, NVIDIA's immediate action {row.bucket}{why}"


AGENT_TABLE_HEADER = ('"""The XID catalogue as the agent acts on it (read by eas_agent/xid_verdict.py): XID -> (mnemonic,\n'
                      'NVIDIA\'s Resolution Bucket, remediation rung). Generated from operate/xid_catalog.yml by\n'
                      '``python -m operate.xid_catalog > eas_agent/xid_actions.py``; a unit test keeps the two equal."""\n')


def agent_table(catalog: Catalog) -> dict[int, tuple[str, str, str]]:
    """What the agent's copy (``eas_agent/xid_actions.py``: the agent is installed without this package) must
    hold: each row's mnemonic, bucket and rung by XID."""
    return {x: (r.mnemonic, r.bucket, r.rung) for x, r in sorted(catalog.rows.items())}


def agent_table_source(catalog: Catalog) -> str:
    rows = "".join(f"    {x}: ({', '.join(json.dumps(v) for v in row)}),\n" for x, row in agent_table(catalog).items())
    return f"{AGENT_TABLE_HEADER}\nSOURCE = {json.dumps(catalog.source)}\nXID_ACTIONS = {{\n{rows}}}\n"


if __name__ == "__main__":
    print(agent_table_source(load_catalog()), end="")
