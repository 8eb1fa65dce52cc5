"""The edge's metrics: labelled children looked up once (edge.metrics.LabelCache), the same series as labels()."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from edge.metrics import LabelCache

pytestmark = pytest.mark.unit


def test_a_label_cache_hands_out_the_metrics_own_children():
    registry = CollectorRegistry()
    requests = Counter("requests", "by endpoint and code", ["endpoint", "code"], registry=registry)
    picks = Counter("picks", "by mode", ["mode"], registry=registry)
    requests_of, picks_of = LabelCache(requests), LabelCache(picks)
    assert b"requests_total{" not in generate_latest(registry)  # no series before one is used
    requests_of["/v1/completions", "200"].inc()
    requests_of["/v1/completions", "200"].inc()
    picks_of["p2c"].inc()
    assert requests_of["/v1/completions", "200"] is requests.labels("/v1/completions", "200")
    assert picks_of["p2c"] is picks.labels("p2c")
    text = generate_latest(registry).decode()
    assert 'requests_total{code="200",endpoint="/v1/completions"} 2.0' in text
    assert 'picks_total{mode="p2c"} 1.0' in text
