"""What the edge announces for a request whose prompt is partly in the chosen IU's prefix cache."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from edge.config import EdgeConfig
from tests.integration.edge.test_announce import FakeAgent, _decision, _state, run, until

pytestmark = pytest.mark.integration

HOST = "127.0.74.1"


@pytest.mark.parametrize(("prompt", "cached", "announced"), [(321, 300, 21), (321, 0, 321), (321, 321, 1)])
def test_the_announcement_counts_the_tokens_the_iu_must_prefill_not_those_it_holds(prompt, cached, announced):
    """The agent adds an announcement's tokens / prefill rate to the IU's score until its next scrape: a
    conversation's turn whose context is cached there costs the IU only its new tokens (at least the last)."""
    async def test(sender, _ledger, _session):
        agent = await FakeAgent("n0").start(HOST)
        try:
            state = _state(sender)
            port = int(agent.address.rsplit(":", 1)[1])
            state.config = EdgeConfig(push=type(state.config.push)(agent_port=port))
            sender.ledger = state.router.ledger
            seq = state.router.sent("n0-iu0", time.time())
            state.announce(replace(_decision(HOST), cached_tokens=cached), prompt, seq, 1764780000.0)
            await until(lambda: agent.posts, what="the POST")
            assert agent.posts[0]["body"]["announcements"] == [
                {"iu": "n0-iu0", "tokens": announced, "seq": 1, "sent": 1764780000.0}]
        finally:
            await agent.stop()

    run(test)
