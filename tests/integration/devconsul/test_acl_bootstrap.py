"""``PUT /v1/acl/bootstrap``: the first management token, made once, with the caller's secret.

Contract (https://developer.hashicorp.com/consul/api-docs/acl#bootstrap-acls): "a special one-time bootstrap
of the ACL system, making the first management token if the acl.tokens.initial_management configuration entry
is not specified ... and if the cluster has not been bootstrapped previously. An operator created token can be
provided in the body of the request ... in a UUID format"; ACL required: none. A second call is refused with
403 "Permission denied: ACL bootstrap no longer allowed (reset index: N)" (Consul's
``ACLBootstrapNotAllowedErr``, the text ``consul acl bootstrap`` prints). Against a real, bootstrapped Consul
(``CONSUL_HTTP_ADDR`` with a management token in ``CONSUL_HTTP_TOKEN``) the refusal is checked there too.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest

from tests.helpers.devconsul import REAL_CONSUL, Api

pytestmark = pytest.mark.integration

REFUSED = re.compile(r"^Permission denied: ACL bootstrap no longer allowed \(reset index: \d+\)")


@pytest.mark.skipif(not (REAL_CONSUL and os.environ.get("CONSUL_HTTP_TOKEN")),
                    reason="a real Consul with ACLs on and bootstrapped (the dev server: the tests below)")
def test_a_bootstrapped_real_consul_refuses_another_bootstrap(consul_addr):
    answer = Api(consul_addr).put("/v1/acl/bootstrap", json={"BootstrapSecret": str(uuid.uuid4())})
    assert answer.status_code == 403 and REFUSED.match(answer.text), answer.text


def test_bootstrap_makes_the_callers_secret_a_management_token_once(dev_server, tmp_path):
    server = dev_server(addr="127.0.75.3:0", acl_enabled=True, data_dir=tmp_path / "data")
    anonymous, secret = Api(server.address), str(uuid.uuid4())
    assert anonymous.put("/v1/kv/x", data="1").status_code == 403  # ACLs on, default deny, no token yet
    answer = anonymous.put("/v1/acl/bootstrap", json={"BootstrapSecret": secret})
    assert answer.status_code == 200, answer.text
    token = answer.json()
    assert token["SecretID"] == secret and [p["Name"] for p in token["Policies"]] == ["global-management"]
    assert Api(server.address, secret).put("/v1/kv/x", data="1").status_code == 200
    again = anonymous.put("/v1/acl/bootstrap", json={"BootstrapSecret": str(uuid.uuid4())})
    assert again.status_code == 403 and REFUSED.match(again.text), again.text
    server.stop()
    restarted = dev_server(addr="127.0.75.3:0", acl_enabled=True, data_dir=tmp_path / "data")
    assert Api(restarted.address).put("/v1/acl/bootstrap").status_code == 403  # kept on disk
    assert Api(restarted.address, secret).get("/v1/acl/token/self").json()["AccessorID"] == token["AccessorID"]


def test_without_a_secret_consul_makes_one_and_a_bad_one_bootstraps_nothing(dev_server):
    server = dev_server(addr="127.0.75.3:0", acl_enabled=True)
    anonymous = Api(server.address)
    assert anonymous.put("/v1/acl/bootstrap", json={"BootstrapSecret": "not-a-uuid"}).status_code == 400
    answer = anonymous.put("/v1/acl/bootstrap")
    assert answer.status_code == 200 and uuid.UUID(answer.json()["SecretID"])


def test_an_initial_management_token_counts_as_the_bootstrap(dev_server):
    server = dev_server(addr="127.0.75.3:0", acl_token=str(uuid.uuid4()))
    answer = Api(server.address).put("/v1/acl/bootstrap", json={"BootstrapSecret": str(uuid.uuid4())})
    assert answer.status_code == 403 and REFUSED.match(answer.text), answer.text
    assert Api(server.address).get("/v1/acl/bootstrap").status_code == 405
