"""``?filter=`` on the health and catalog service endpoints, and ``X-Consul-Default-ACL-Policy``.

Contract (runs against a real Consul too, with CONSUL_HTTP_ADDR):
- https://developer.hashicorp.com/consul/api-docs/features/filtering: "<Selector> == "<Value>"", "!=",
  "is empty", "is not empty", ""<Value>" in <Selector>", "not in", "contains", "not contains", "matches",
  "not matches"; "and", "or", "not" and parentheses.
- https://developer.hashicorp.com/consul/api-docs/health#filtering-2 (List Service Instances: selectors
  Node.*, Service.ID/Service/Tags/Meta/Port/Address, Checks.*) and
  https://developer.hashicorp.com/consul/api-docs/catalog#filtering-1 (List Nodes for Service: ServiceID,
  ServiceTags, ServiceMeta, ServicePort, Node, ...); the check lists (List Checks for Node, List Checks for
  Service, List Checks in State) take ``filter`` too, over a check's Node, CheckID, Name, Status, ServiceID,
  ServiceName, ServiceTags, ...
- https://developer.hashicorp.com/consul/api-docs/api-structure#default-acl-policy: "All API responses for
  Consul versions after 1.9 will include an HTTP response header X-Consul-Default-ACL-Policy set to either
  "allow" or "deny" ... This value is returned even if ACLs are disabled."
"""

from __future__ import annotations

import pytest

from devconsul import bexpr

pytestmark = pytest.mark.integration


@pytest.fixture
def three(api, name, cleanup):
    ius = [
        (f"{name}-a", 8001, ["rack:r1", "node:n1"], {"node": "n1", "numa-node": "0"}, "passing"),
        (f"{name}-b", 8002, ["rack:r1", "node:n2"], {"node": "n2", "numa-node": "1"}, "critical"),
        (f"{name}-c", 8003, ["rack:r2", "node:n3"], {"node": "n3"}, "passing"),
    ]
    for sid, port, tags, meta, status in ius:
        cleanup.services.append(sid)
        body = {"Name": name, "ID": sid, "Port": port, "Tags": tags, "Meta": meta,
                "Check": {"TTL": "60s", "Status": status}}
        assert api.put("/v1/agent/service/register", json=body).status_code == 200
    return name


def _ids(resp, key):
    assert resp.status_code == 200, resp.text
    return sorted(key(e) for e in resp.json())


@pytest.mark.parametrize(
    "expr, want",
    [
        ('Service.Meta.node == "n1"', ["a"]),
        ('"rack:r1" in Service.Tags', ["a", "b"]),
        ('Service.Tags contains "node:n3"', ["c"]),
        ('"rack:r1" not in Service.Tags', ["c"]),
        ("Service.Port == 8002", ["b"]),
        ('Service.Port != "8002"', ["a", "c"]),
        ('Service.Meta["numa-node"] is empty', ["c"]),
        ("Service.Meta.node is not empty", ["a", "b", "c"]),
        ('Service.ID matches "-[ab]$"', ["a", "b"]),
        ('Service.ID not matches "-[ab]$"', ["c"]),
        ('Checks.Status == "critical"', ["b"]),
        ('not Checks.Status == "critical" and Service.Meta.node != "n3"', ["a"]),
        ('(Service.Port == 8001 or Service.Port == 8003) and "rack:r2" in Service.Tags', ["c"]),
    ],
)
def test_health_service_filter(api, three, expr, want):
    resp = api.get(f"/v1/health/service/{three}", params={"filter": expr})
    assert _ids(resp, lambda e: e["Service"]["ID"][-1]) == want


def test_catalog_service_filter(api, three):
    resp = api.get(f"/v1/catalog/service/{three}", params={"filter": 'ServiceMeta.node == "n2"'})
    assert _ids(resp, lambda e: e["ServiceID"][-1]) == ["b"]
    resp = api.get(f"/v1/catalog/service/{three}", params={"filter": '"rack:r2" in ServiceTags'})
    assert _ids(resp, lambda e: e["ServiceID"][-1]) == ["c"]


@pytest.mark.parametrize(("path", "expr", "want"), [
    ("/v1/health/state/any", 'ServiceName == "{name}" and Status == "critical"', ["b"]),
    ("/v1/health/state/passing", 'ServiceID matches "-[bc]$"', ["c"]),
    ("/v1/health/checks/{name}", '"node:n1" in ServiceTags or ServiceID == "{name}-c"', ["a", "c"]),
    ("/v1/health/state/any", 'ServiceName matches "^{name}$" and ServiceID is not empty', ["a", "b", "c"]),
])
def test_check_list_filter(api, three, path, expr, want):
    """What a reader of every IU check sends: the check lists filter each check by its own fields."""
    resp = api.get(path.format(name=three), params={"filter": expr.format(name=three)})
    assert _ids(resp, lambda c: c["ServiceID"][-1]) == want


def test_check_list_bad_selector_is_a_400(api):
    assert api.get("/v1/health/state/any", params={"filter": "Service.ID == \"x\""}).status_code == 400


@pytest.mark.parametrize("expr", ["Service.Nope == 1", "Service.Port ==", "(Service.Port == 1", "Service == 1"])
def test_bad_filter_is_a_400(api, three, expr):
    resp = api.get(f"/v1/health/service/{three}", params={"filter": expr})
    assert resp.status_code == 400


def test_filter_and_passing_combine(api, three):
    resp = api.get(f"/v1/health/service/{three}", params={"filter": '"rack:r1" in Service.Tags', "passing": "1"})
    assert _ids(resp, lambda e: e["Service"]["ID"][-1]) == ["a"]


@pytest.mark.parametrize("path", ["/v1/status/leader", "/v1/kv/nope", "/v1/catalog/services", "/v1/nope"])
def test_default_acl_policy_header_on_every_response(api, path):
    resp = api.get(path)
    assert resp.headers.get("X-Consul-Default-ACL-Policy") in ("allow", "deny")


def test_default_acl_policy_reflects_acls():
    import requests

    from devconsul.server import DevConsulServer

    for token, want in ((None, "allow"), ("t0ken", "deny")):
        with DevConsulServer(addr="127.0.0.1:0", acl_token=token) as server:
            resp = requests.get(f"http://{server.address}/v1/kv/x", timeout=5)
            assert resp.headers["X-Consul-Default-ACL-Policy"] == want


def test_filter_parser_never_raises_anything_but_a_400():
    """Fuzz: random token soup is parsed or refused with FilterError, nothing else."""
    import random

    rng = random.Random(15)
    words = ["Service.Port", "Service.Meta.node", "Checks.Status", "==", "!=", "in", "not", "and", "or", "(",
             ")", '"x"', "`y`", "is", "empty", "contains", "matches", '"[a-"', "Service.Tags", "[", "]", ".", "8000"]
    for _ in range(3000):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 9)))
        try:
            tree = bexpr.parse(text, bexpr.HEALTH_SERVICE_FIELDS)
        except bexpr.FilterError:
            continue
        bexpr.evaluate(tree, {"Service": {"Port": 8000, "Tags": ["x"], "Meta": {}}, "Checks": [{"Status": "x"}]})


def test_backtracking_pattern_answers_at_once_and_others_are_served(api, name, cleanup):
    """Consul's ``matches`` is Go's regexp (RE2): linear time for every pattern. Guards against: Python's ``re``
    took 21 s for ``^(.*)*z$`` on a 28-character ID, holding the state lock (and the GIL) meanwhile, so
    every other client waited too."""
    import threading
    import time

    import requests

    sid = f"{name}-abcdefgh"  # 28 characters
    cleanup.services.append(sid)
    assert api.put("/v1/agent/service/register", json={"Name": name, "ID": sid}).status_code == 200
    headers = {"X-Consul-Token": api.token} if api.token else {}
    answered: dict = {}

    def filtered():
        started = time.monotonic()
        resp = requests.get(f"{api.base}/v1/health/service/{name}", headers=headers, timeout=60,
                            params={"filter": 'Service.ID matches "^(.*)*z$"'})
        answered["filter"] = (resp, time.monotonic() - started)

    worker = threading.Thread(target=filtered, daemon=True)
    sent = time.monotonic()
    worker.start()
    time.sleep(0.3)  # the filter is being evaluated (not: for 21 s)
    leader = requests.get(f"{api.base}/v1/status/leader", headers=headers, timeout=5)
    # measured from the filter's start: against the in-process dev server a stalled GIL stalls this
    # thread's clock-reading too, so only the total shows the wait
    assert leader.status_code == 200 and time.monotonic() - sent < 1.5, "another client waited on the filter"
    worker.join(60)
    resp, took = answered["filter"]
    assert resp.status_code == 200 and resp.json() == [] and took < 1.0


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=a)", "(?<!a)b", "(?P<x>a)(?P=x)"])
def test_pattern_re2_refuses_is_a_400(api, three, pattern):
    """Go's regexp has no backreferences and no lookaround; Consul refuses such a filter."""
    expr = "Service.ID matches `" + pattern + "`"
    assert api.get(f"/v1/health/service/{three}", params={"filter": expr}).status_code == 400


@pytest.mark.parametrize("pattern, want", [("(?i)-A$", ["a"]), (r"-[a-b]\z", ["a", "b"]), (r"\bc$", ["c"]), (r"\Bc$", [])])
def test_matches_uses_re2_syntax(api, three, pattern, want):
    expr = "Service.ID matches `" + pattern + "`"
    resp = api.get(f"/v1/health/service/{three}", params={"filter": expr})
    assert _ids(resp, lambda e: e["Service"]["ID"][-1]) == want


def test_node_selectors(api, three):
    """The health page lists Node.* selectors (Node, Address, Datacenter, ID, Meta, TaggedAddresses)."""
    node = api.get(f"/v1/health/service/{three}").json()[0]["Node"]
    every = ["a", "b", "c"]
    cases = [
        (f'Node.Node == "{node["Node"]}"', every),
        (f'Node.Node != "{node["Node"]}"', []),
        (f'Node.Address == "{node["Address"]}"', every),
        (f'Node.Datacenter == "{node["Datacenter"]}" and Node.ID is not empty', every),
        (f'Node.TaggedAddresses.lan == "{node["TaggedAddresses"]["lan"]}"', every),
        ('Node.Meta["no-such-key"] is empty', every),
        ('"no-such-key" in Node.Meta', []),
        (f'Node.Node matches "^{node["Node"][:1]}" and Service.Meta.node == "n2"', ["b"]),
    ]
    for expr, want in cases:
        resp = api.get(f"/v1/health/service/{three}", params={"filter": expr})
        assert _ids(resp, lambda e: e["Service"]["ID"][-1]) == want, expr
    assert api.get(f"/v1/health/service/{three}", params={"filter": "Node.Nope == 1"}).status_code == 400
