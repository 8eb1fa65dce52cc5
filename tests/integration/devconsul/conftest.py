"""Fixtures for the Consul HTTP API contract suite.

Every test talks HTTP to ``consul_addr`` (tests/conftest.py): a fresh dev server per test, or the real
Consul named by ``CONSUL_HTTP_ADDR`` (with ``CONSUL_HTTP_TOKEN`` when its ACLs are on). Names are made
unique per test so the suite can run against a long-lived Consul. Tests that need to configure or
restart the server itself use ``dev_server`` and are skipped against a real Consul.
"""

from __future__ import annotations

import os
import uuid

import consul
import pytest

from devconsul.server import DevConsulServer
from tests.helpers.devconsul import DEV_ACL_TOKEN, REAL_CONSUL, Api, Cleanup, TinyHTTP, _client


@pytest.fixture
def c(consul_addr) -> consul.Consul:
    return _client(consul_addr, os.environ.get("CONSUL_HTTP_TOKEN"))


@pytest.fixture
def api(consul_addr) -> Api:
    return Api(consul_addr, os.environ.get("CONSUL_HTTP_TOKEN"))


@pytest.fixture
def name() -> str:
    """A name unique to this test run, for keys and services."""
    return f"contract-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cleanup(c):
    todo = Cleanup()
    yield todo
    for sid in todo.services:
        try:
            c.agent.service.deregister(sid)
        except consul.ConsulException:  # already gone
            pass
    for prefix in todo.prefixes:
        c.kv.delete(prefix, recurse=True)


@pytest.fixture
def dev_server(tmp_path):
    """Factory for dev servers with chosen settings; each is stopped at teardown."""
    if REAL_CONSUL:
        pytest.skip("configures or restarts the dev server itself")
    from devconsul.server import DevConsulServer

    started: list[DevConsulServer] = []

    def make(**kwargs) -> DevConsulServer:
        kwargs.setdefault("addr", "127.0.0.1:0")
        server = DevConsulServer(**kwargs).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def tiny_http():
    server = TinyHTTP()
    yield server
    server.close()


@pytest.fixture
def dev():
    """A dev server of its own (node n1), stopped at teardown."""
    with DevConsulServer(addr="127.0.0.1:0", node_name="n1") as server:
        yield server


@pytest.fixture
def dev_acl():
    """A dev server of its own with ACLs on (management token ``DEV_ACL_TOKEN``), stopped at teardown."""
    with DevConsulServer(addr="127.0.0.1:0", node_name="n1", acl_token=DEV_ACL_TOKEN) as server:
        yield server
