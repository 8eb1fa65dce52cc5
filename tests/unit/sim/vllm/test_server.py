"""The simulated IU's bad-canary controls: an engine N times slower, a share of requests answered 500 in vLLM's
error shape."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from sim.vllm.server import SimulatedIU

pytestmark = pytest.mark.unit
HOST = "127.0.65.31"


def post(address: str, tokens: int = 327, output: int = 12) -> tuple[int, dict]:
    body = json.dumps({"prompt_tokens": tokens, "max_tokens": output}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://{address}/v1/completions", data=body),
                                    timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_slowed_engine_runs_its_model_time_at_a_fraction_of_real_time():
    now = [100.0]
    sim = SimulatedIU(HOST, 0, arrival_rate=0, clock=lambda: now[0], slowdown=2.0)
    try:
        before = sim.clock()
        now[0] += 10.0
        assert sim.clock() - before == pytest.approx(5.0)
    finally:
        sim.server.server_close()


def test_a_request_takes_twice_as_long_on_a_twice_slower_engine():
    took = {}
    for slowdown in (1.0, 2.0):
        with SimulatedIU(HOST, 0, arrival_rate=0, slowdown=slowdown) as sim:
            started = time.monotonic()
            status, answer = post(sim.address, output=24)
            took[slowdown] = time.monotonic() - started
            assert status == 200 and answer["completion_tokens"] == 24
    assert 1.5 <= took[2.0] / took[1.0] <= 2.6, took


def test_failing_requests_are_answered_500_in_vllms_error_shape():
    with SimulatedIU(HOST, 0, arrival_rate=0, error_fraction=1.0) as sim:
        status, answer = post(sim.address)
        assert status == 500
        assert answer == {"error": {"message": "simulated engine error", "type": "InternalServerError",
                                    "param": None, "code": 500}}
        assert sim.model.success_total == 0  # the engine never saw it


@pytest.mark.parametrize("options", [{"slowdown": 0.5}, {"error_fraction": 1.5}])
def test_controls_out_of_range_are_refused(options):
    with pytest.raises(ValueError, match="out of range"):
        SimulatedIU(HOST, 0, **options)
