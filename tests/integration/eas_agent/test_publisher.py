"""The agent's publisher when Consul goes down and comes back: nothing acknowledged is lost, the agent keeps
scoring and publishes again by itself."""

from __future__ import annotations

import time

import pytest

from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from edge.pool import AnomalyDetector, ConsulWatcher, PoolView
from tests.helpers import wait_for
from tests.helpers.hostile import GOOD
from tests.integration.eas_agent.test_agent import agent_for, register, start, stored_seq

pytestmark = pytest.mark.integration


def test_consul_down_and_back(tmp_path, tally):
    data = tmp_path / "consul"
    server = DevConsulServer(addr="127.0.0.1:0", data_dir=data, node_name="n1").start()  # n1's own agent
    address = server.address
    register(address, "n1-iu0", "n1")
    agent = agent_for("n1", address, [lambda: GOOD])
    thread = start(agent)
    view = PoolView(detector=AnomalyDetector())
    watcher = ConsulWatcher(view, ConsulIO(address, timeout_s=2.0), wait_s=1.0, max_backoff_s=0.3).start()
    try:
        wait_for(lambda: stored_seq(address, "n1") >= 2, 10, "first writes")
        wait_for(lambda: view.snapshot().scored, 10, "the reader to see n1-iu0")
        server.stop()  # Consul down: the agent keeps collecting, the reader keeps its last view
        time.sleep(1.5)
        assert thread.is_alive() and all(t.is_alive() for t in watcher.threads)
        assert agent.publisher.stats.errors > 0 and agent.cycles > 10
        before = agent.publisher.seq
        server = DevConsulServer(addr=address, data_dir=data, node_name="n1").start()  # back, same port and state
        wait_for(lambda: stored_seq(address, "n1") > before, 10, "the agent to catch up after the outage")
        wait_for(lambda: view.snapshot().scored and watcher.updates > 2, 10, "the reader to resume")
        assert all(t.is_alive() for t in watcher.threads)
    finally:
        watcher.stop()
        agent.request_stop()
        thread.join(5)
        server.stop()
    tally.fault("Consul down 1.5 s (agent + edge reader)")
