"""consul_io/iu_listing.py: a refresh reads again only the IU services whose checks, node checks or
registrations changed, and its answer is what reading every service would give."""

from __future__ import annotations

import pytest

from consul_io.iu_listing import CHECKS_FILTER, IUListing, all_passing

pytestmark = pytest.mark.unit


class Catalog:
    """What Consul would answer: per node, its node checks and its IU instances with their checks."""

    def __init__(self, nodes: int):
        self.index = 10
        self.services_index = 10
        self.nodes = {f"n{k}": {"serf": self.bump(), "ius": {f"n{k}-iu0": ("127.0.75.1", self.bump())}}
                      for k in range(nodes)}
        self.reads: list[str] = []

    def bump(self) -> int:
        self.index += 1
        return self.index

    def checks(self) -> list[dict]:
        out = []
        for node, data in self.nodes.items():
            out.append({"Node": node, "CheckID": "serfHealth", "ServiceID": "", "ModifyIndex": data["serf"]})
            for iu, (_, modified) in data["ius"].items():
                out.append({"Node": node, "CheckID": f"vllm-iu:{iu}:health", "ServiceID": iu,
                            "ServiceName": f"vllm-iu-{node}", "ModifyIndex": modified})
        return out

    def names(self) -> dict:
        return {"consul": [], **{f"vllm-iu-{node}": [] for node in self.nodes}}

    def entries(self, name: str) -> list[dict]:
        self.reads.append(name)
        node = name.removeprefix("vllm-iu-")
        data = self.nodes[node]
        return [{"Node": {"Node": node}, "Service": {"ID": iu, "Service": name, "Address": address},
                 "Checks": [{"CheckID": "serfHealth", "Status": "passing"},
                            {"CheckID": f"vllm-iu:{iu}:health", "Status": f"passing@{modified}"}]}
                for iu, (address, modified) in sorted(data["ius"].items())]

    def everything(self) -> list[dict]:
        return [e for name in sorted(self.names()) if name != "consul" for e in self.entries(name)]


def refresh(listing: IUListing, catalog: Catalog) -> tuple[list, list[str]]:
    catalog.reads.clear()
    entries = listing.refresh(catalog.checks(), catalog.services_index, catalog.names(), catalog.entries)
    read = list(catalog.reads)
    assert entries == catalog.everything()  # the same answer as reading every service
    return entries, read


def test_the_first_refresh_reads_every_service_then_only_what_changed():
    catalog, listing = Catalog(32), IUListing()
    assert len(refresh(listing, catalog)[1]) == 32
    assert refresh(listing, catalog)[1] == []  # nothing changed: the two cluster-wide requests only
    catalog.nodes["n7"]["ius"]["n7-iu0"] = ("127.0.75.1", catalog.bump())  # its check changed
    assert refresh(listing, catalog)[1] == ["vllm-iu-n7"]
    catalog.nodes["n3"]["serf"] = catalog.bump()  # a node check changed: that node's instances
    assert refresh(listing, catalog)[1] == ["vllm-iu-n3"]
    assert listing.fetched == 34


def test_a_registration_change_reads_every_service_again():
    """catalog/services says that some registration changed, not which: an address is not in any check."""
    catalog, listing = Catalog(4), IUListing()
    refresh(listing, catalog)
    node = catalog.nodes["n2"]["ius"]
    node["n2-iu0"] = ("127.0.75.9", node["n2-iu0"][1])
    catalog.services_index = catalog.bump()
    entries, read = refresh(listing, catalog)
    assert len(read) == 4 and "127.0.75.9" in {e["Service"]["Address"] for e in entries}


def test_added_and_removed_checks_and_services_are_read():
    catalog, listing = Catalog(4), IUListing()
    refresh(listing, catalog)
    catalog.nodes["n1"]["ius"]["n1-iu1"] = ("127.0.75.1", catalog.bump())  # a new instance comes with its check
    assert refresh(listing, catalog)[1] == ["vllm-iu-n1"]
    del catalog.nodes["n1"]["ius"]["n1-iu1"]  # a deregistration takes its check with it
    assert refresh(listing, catalog)[1] == ["vllm-iu-n1"]
    del catalog.nodes["n3"]
    catalog.services_index = catalog.bump()
    entries, _ = refresh(listing, catalog)
    assert {e["Node"]["Node"] for e in entries} == {"n0", "n1", "n2"}


def test_a_failed_read_leaves_the_listing_to_be_read_again():
    catalog, listing = Catalog(4), IUListing()
    refresh(listing, catalog)
    catalog.nodes["n0"]["ius"]["n0-iu0"] = ("127.0.75.1", catalog.bump())

    def broken(name):
        raise OSError("Consul went away")

    with pytest.raises(OSError):
        listing.refresh(catalog.checks(), catalog.services_index, catalog.names(), broken)
    assert refresh(listing, catalog)[1] == ["vllm-iu-n0"]


def test_garbage_checks_are_skipped_and_other_services_never_read():
    catalog, listing = Catalog(2), IUListing()
    checks = catalog.checks() + ["nonsense", {"ServiceID": "x", "ServiceName": "web", "ModifyIndex": 3}]
    entries = listing.refresh(checks, catalog.services_index, {**catalog.names(), "web": []}, catalog.entries)
    assert sorted(catalog.reads) == ["vllm-iu-n0", "vllm-iu-n1"] and len(entries) == 2


def test_passing_means_every_check_passing_and_the_filter_keeps_node_and_iu_checks():
    assert all_passing({"Checks": [{"Status": "passing"}, {"Status": "passing"}]})
    assert not all_passing({"Checks": [{"Status": "passing"}, {"Status": "warning"}]})
    assert CHECKS_FILTER == 'ServiceID == "" or ServiceName matches "^vllm-iu-."'
