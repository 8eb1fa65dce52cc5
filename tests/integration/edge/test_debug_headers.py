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
        assert not [name for name in headers if name.startswith("X-Eas-")]  # nor the pick's scores
        status, headers, _ = post(edge.url("/v1/completions"), completion(model="no-such-model"))
        assert status >= 400 and "X-Eas-IU" not in headers
    with running_edge(pool, debug_headers=True) as edge:
        status, headers, _ = post(edge.url("/v1/completions"), completion())
        assert status == 200 and headers["X-Eas-IU"] in pool.ius


def test_a_resumed_stream_names_no_iu_where_it_was_spliced_unless_debug_headers_is_on(consul_addr):
    pool = Pool(consul_addr, nodes=2, ius_per_node=1)
    try:
        for node in pool.nodes:
            pool.publish_kv(node, {f"{node}-iu0": 0.01})
        pool.ius["n0-iu0"].die_after_tokens = 5
        with running_edge(pool, debug_headers=False) as edge:
            edge.state.router.rng.random = lambda: 0.0  # pick n0-iu0 first (sampling index 0)
            status, headers, lines = stream(edge.url("/v1/completions"), completion(max_tokens=40, stream=True))
            comments = [line for _, line in lines if line.startswith(b":")]
            assert status == 200 and "X-Eas-IU" not in headers and headers["X-Edge-Resumable"] == "1"
            assert comments == [b": resumed after mid_stream"] and lines[-1][1] == b"data: [DONE]"
    finally:
        pool.stop()
