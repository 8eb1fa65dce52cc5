"""Score calibration through a real pool: a unit whose agent believes its engine 20 times faster than it is
(prefill and decode) is flagged, the honest units are not, every unit is decided (calibrate sends more
requests until each has the clean answers its verdict needs), and a unit in maintenance gets no request (the
breaker, measured).

bench/calibrate_power.py runs this calibration repeatedly, quiet and beside CPU burners, and counts misses and
false flags."""

from __future__ import annotations

import math

import pytest

from consul_io import layout
from consul_io.client import ConsulIO
from eas_agent.score import DrainParams
from operate import calibrate
from operate.scenario import load_scenario, parse_scenario
from tests.integration.operate.pool import POOL_NET, TRUE_PREFILL_TPS, live_pool

pytestmark = [pytest.mark.integration, pytest.mark.realtime]  # measured waits: load-sensitive

LIAR = "n3-iu0"  # live_pool's third node (liar=2)
NODES = 3
# The liar's agent believes its engine 20x faster than it is, in prefill and in decode: with the prefill rate
# alone its decode-step term still carried its score, and under CPU load its scale came within 1.3-1.6x of
# the pool's, where no amount of answers flags it.
LIAR_PRIOR = 20 * TRUE_PREFILL_TPS
LIAR_DECODE_PRIOR = 20 * DrainParams.decode_tps_prior
# The time this test takes is the clean answers each honest unit needs before it is cleared, over the answers
# a unit gets per second. Prompts of half the production lengths at twice the rate load each unit as the full
# mix at 10 requests/s does (the engine's busy share, so its queue waits), with answers twice as fast.
PROMPT_SCALE, RATE = 0.5, 20.0
# The liar's scale reads 1.8-3.2x below the pool's median (bench/calibrate_power.py; under CPU load an honest
# unit's own scale can fall and drag the three-unit median toward it): no unit is decided before its answers
# would flag a unit 2.2x off with 99% power.
DETECT_SCALE = 2.2
# An honest unit's answers scatter its log(scale) by about 1.0 each (the standard error x the root of the count:
# 0.87-1.28 with the full-length mix in bench/calibrate_power.py's runs, more with half lengths): the first round
# brings each unit at least about the answers its verdict needs at that detection scale
# (calibrate.needed_samples), and calibrate sizes any further round from what is still missing.
ANSWER_LOG_SD = 1.0
REQUESTS = NODES * math.ceil((ANSWER_LOG_SD / calibrate.max_log_se(DETECT_SCALE)) ** 2)
# Beside two CPU spinners an honest unit was still undecided after 1,296 requests (4 x the first round) in a run:
# calibrate stops at the cap with it undecided, which fails the test.
MAX_REQUESTS = 6 * REQUESTS


def production_prompts_short_outputs():
    """The production prompt mix at :data:`PROMPT_SCALE` of its lengths, with ~12-token answers: the queue
    waits are the prefills', and a test need not wait ~10 s for a 614-token answer to stream out."""
    data = {"name": "production-prompts", "classes": {}}
    for klass in load_scenario().classes:
        data["classes"][klass.name] = {"share": klass.share,
                                       "prompt_tokens": {"mean": round(klass.prompt.mean * PROMPT_SCALE),
                                                         "sigma": klass.prompt.sigma},
                                       "output_tokens": {"mean": 12, "sigma": 0.3},
                                       "slo": {"ttft_p99_ms": klass.slo.ttft_p99_ms}}
    return parse_scenario(data, "production-prompts")


class NodeAgent(ConsulIO):
    """The unit's node agent as the one dev Consul stands in for it: maintenance is agent-local in Consul
    (``PUT /v1/agent/service/maintenance/:id`` on the agent holding the service), and these IUs sit on catalog
    nodes with no agent of their own, so the agent's effect is written where that agent would sync it: the
    critical ``_service_maintenance:<id>`` check on the IU's catalog node."""

    def __init__(self, address: str, node: str, node_address: str):
        super().__init__(address)
        self.node, self.node_address = node, node_address

    def service_maintenance(self, service_id: str, enable: bool, reason: str = "") -> None:
        check_id = layout.maintenance_check(service_id)
        if enable:
            check = {"CheckID": check_id, "Name": "Service Maintenance Mode", "Status": "critical",
                     "Notes": reason, "ServiceID": service_id}
            assert self.client.catalog.register(self.node, self.node_address, check=check, token=self.token)
        else:
            assert self.client.catalog.deregister(self.node, check_id=check_id, token=self.token)


def test_a_unit_scoring_with_a_wrong_prefill_rate_is_flagged_and_the_breaker_holds(tmp_path, consul_addr):
    with live_pool(tmp_path, consul_addr, nodes=NODES, liar=2, liar_prior=LIAR_PRIOR,
                   liar_decode_prior=LIAR_DECODE_PRIOR) as (edge, ius):
        endpoint = f"http://{edge.address}"
        # A second calibration only when the first did not flag the liar alone: under overload (a starved host)
        # the score's KV term, which the liar does not lie about, carries every score and the liar's scale can
        # come within the limit of the pool's (1 run in 20 beside two CPU spinners, bench/calibrate_power.py);
        # two such runs in a row fail the test.
        for attempt in range(2):
            result = calibrate.run(endpoint, production_prompts_short_outputs(), rate=RATE, requests=REQUESTS,
                                   max_requests=MAX_REQUESTS, detect_scale=DETECT_SCALE, seed=3 + attempt)
            if result.flagged == [LIAR]:
                break
        by_unit = {u.unit: u for u in result.units}
        assert set(by_unit) == set(ius), result.as_dict()
        assert result.undecided == [], result.as_dict()  # every unit decided: the liar's miss is not a silent pass
        assert result.flagged == [LIAR], result.as_dict()
        liar = by_unit[LIAR]
        assert liar.bias_s < min(u.bias_s for u in result.units if u.unit != LIAR) - calibrate.BIAS_FLOOR_S
        assert liar.flags[0].startswith("reads low")
        # the pool's reference rate is the honest units' published one, not the liar's
        assert result.reference_prefill_tps < 2 * TRUE_PREFILL_TPS
        assert not result.passed

        with calibrate.out_of_rotation(NodeAgent(consul_addr, "n1", f"{POOL_NET}.1"), "n1-iu0", endpoint):
            # half the rate: two units are left, and the liar among them draws most of it; a unit whose queue
            # stays silent past the edge's first-byte wait costs the check an answer. Were the breaker open,
            # 30 requests would all miss n1 with odds of (2/3)^30 ~ 5e-6.
            breaker = calibrate.breaker_share(endpoint, production_prompts_short_outputs(), "n1-iu0", rate=RATE / 2,
                                              requests=30, seed=4)
        assert breaker.requests == 30 and breaker.sent_to_unit == 0 and breaker.passed
