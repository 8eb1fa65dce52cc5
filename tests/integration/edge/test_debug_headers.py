"""Internal IU ids reach clients only when the edge's ``debug_headers`` is on (edge/proxy.py)."""

from __future__ import annotations

import pytest

from tests.helpers.edge import MODEL, Pool, post, running_edge, stream

pytestmark = pytest.mark.integration


@pytest.fixture
def pool(consul_addr):
    pool = Pool(consul_addr, nodes=1, ius_per_node=1)
    pool.publish_kv("n0", {"n0-iu0": 0.01})
    yield pool
    pool.stop()


def completion(**extra) -> dict:
    return {"model": MODEL, "prompt": "hello " * 10, "max_tokens": 2, **extra}


def test_answers_name_no_iu_unless_debug_headers_is_on(pool):
    with running_edge(pool, debug_headers=False) as edge:
        status, headers, _ = post(edge.url("/v1/completions"), completion())
        assert status == 200 and "X-Eas-IU" not in headers
        status, headers, _ = stream(edge.url("/v1/completions"), completion(stream=True))
        assert status == 200 and "X-Eas-IU" not in headers
        status, headers, _ = post(edge.url("/v1/completions"), completion(model="no-such-model"))
        assert status >= 400 and "X-Eas-IU" not in headers
    with running_edge(pool, debug_headers=True) as edge:
        status, headers, _ = post(edge.url("/v1/completions"), completion())
        assert status == 200 and headers["X-Eas-IU"] in pool.ius
