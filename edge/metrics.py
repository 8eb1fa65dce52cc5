"""The edge's Prometheus metrics (``GET /metrics``), in their own registry.

Counters and histograms are updated on the request path (labelled ones through :class:`LabelCache`); the
per-IU in-flight gauge, the queue depth, the pool counts and the feed's state are read when scraped (a
custom collector), so nothing is kept twice.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RTT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
AGE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class LabelCache(dict):
    """A labelled metric's children by label values, each looked up once. prometheus_client's ``labels()``
    checks and converts its arguments and takes a lock on every call (~3 µs, several per proxied request);
    a child, once made, is kept by the metric anyway, so keeping it here too costs nothing more.
    ``cache["a"]`` is ``metric.labels("a")``, ``cache["a", "b"]`` is ``metric.labels("a", "b")``."""

    def __init__(self, metric):
        super().__init__()
        self.metric = metric

    def __missing__(self, values):
        child = self[values] = self.metric.labels(*values) if isinstance(values, tuple) else self.metric.labels(values)
        return child


class EdgeMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("eas_edge_requests", "Requests answered, by endpoint and HTTP status.",
                                ["endpoint", "code"], registry=r)
        self.ttft = Histogram("eas_edge_ttft_seconds",
                              "Time from the request's arrival at the edge to the first byte of its answer "
                              "sent to the client (streams: the first chunk).", ["stream"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.picks = Counter("eas_edge_picks", "Routing decisions by pick() mode (p2c, single, fail_open).",
                             ["mode"], registry=r)
        self.score_age = Histogram("eas_edge_score_age_seconds",
                                   "Age of the chosen IU's score when a request was routed on it.",
                                   buckets=AGE_BUCKETS, registry=r)
        self.retries = Counter("eas_edge_retries", "Requests moved to another IU before the first byte reached "
                               "the client, after a failure or while their IU was silent, by reason.", ["reason"], registry=r)
        self.resumed = Counter("eas_edge_resumed", "Streams cut mid-way and resumed on another IU, by the cut's "
                               "kind.", ["reason"], registry=r)
        self.ejections = Counter("eas_edge_ejections", "IUs ejected for their results, by the failure that "
                                 "ejected them (definitive, failed: the consecutive ones).", ["outcome"], registry=r)
        self.probes = Counter("eas_edge_probes", "Half-open probes (GET /health) of ejected IUs, by outcome "
                              "(ok: back in rotation).", ["outcome"], registry=r)
        self.upstream_errors = Counter("eas_edge_upstream_errors", "Failures talking to an IU, by kind.",
                                       ["iu", "kind"], registry=r)
        self.rejected = Counter("eas_edge_rejected", "Requests the edge turned away itself (429 busy, 503 "
                                "unavailable) or dropped because their client left (client_gone), by reason.",
                                ["reason"], registry=r)
        self.queued = Histogram("eas_edge_queue_wait_seconds", "Time requests waited for a free IU slot.",
                                buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0), registry=r)
        self.announce_rtt = Histogram("eas_edge_announce_rtt_seconds",
                                      "Round trip of one announce batch POST to a node agent (200 answers).",
                                      buckets=RTT_BUCKETS, registry=r)
        # the request path's children: requests_of[endpoint, code], ttft_of[stream], picks_of[mode],
        # upstream_errors_of[iu, kind], rejected_of[reason]
        self.requests_of, self.ttft_of, self.picks_of = (LabelCache(m) for m in (self.requests, self.ttft, self.picks))
        self.upstream_errors_of, self.rejected_of = LabelCache(self.upstream_errors), LabelCache(self.rejected)
        self.retries_of, self.resumed_of = LabelCache(self.retries), LabelCache(self.resumed)
        self.ejections_of, self.probes_of = LabelCache(self.ejections), LabelCache(self.probes)

    def watch(self, state) -> None:
        """Scrape-time gauges from the proxy's state (``edge.proxy.EdgeState``)."""
        self.registry.register(_StateCollector(state))


class _StateCollector:
    def __init__(self, state):
        self.state = state

    def collect(self):
        s = self.state
        inflight = GaugeMetricFamily("eas_edge_inflight", "This edge's requests in flight per IU.", labels=["iu"])
        for iu_id, count in sorted(s.router.ledger.inflight.items()):
            inflight.add_metric([iu_id], count)
        yield inflight
        yield GaugeMetricFamily("eas_edge_queue_depth", "Requests waiting for a free IU slot.",
                                value=len(s.admission))
        snapshot = s.view.snapshot()
        pool = GaugeMetricFamily("eas_edge_pool_ius", "IUs in the view: routable, with a score, all.",
                                 labels=["kind"])
        pool.add_metric(["all"], len(snapshot.entries))
        pool.add_metric(["routable"], len(snapshot.healthy))
        pool.add_metric(["scored"], len(snapshot.scored))
        yield pool
        ignored = CounterMetricFamily("eas_edge_scores_ignored", "Agent score reports ignored as nonsense, "
                                      "by reason.", labels=["reason"])
        for reason, count in sorted(s.view.ignored.items()):
            ignored.add_metric([reason], count)
        yield ignored
        registrations = GaugeMetricFamily("eas_edge_registrations_rejected", "IU registrations in Consul's last "
                                          "listing that are never routed (ID, Meta.node or node: tag disagree "
                                          "with the catalog node, or one ID on two nodes), by reason.",
                                          labels=["reason"])
        for reason, count in sorted(s.view.rejected_registrations.items()):
            registrations.add_metric([reason], count)
        yield registrations
        yield CounterMetricFamily("eas_edge_consul_errors", "Failed Consul watch queries.",
                                  value=s.watcher.errors if s.watcher else 0)
        feed = s.feed
        yield CounterMetricFamily("eas_edge_push_batches", "Batches of agent-pushed scores applied.",
                                  value=feed.updates if feed else 0)
        connected = GaugeMetricFamily("eas_edge_push_connected",
                                      "Agents whose stream is open or whose blocking query last succeeded.")
        connected.add_metric([], sum(1 for ok in (feed.connected.values() if feed else ()) if ok))
        yield connected
        streams = GaugeMetricFamily("eas_edge_push_streams", "Connected agents followed over a stream (the others "
                                    "answer blocking queries: agents from before streams).")
        streams.add_metric([], sum(1 for node, on in (feed.streaming.items() if feed else ())
                                   if on and feed.connected.get(node)))
        yield streams
        yield CounterMetricFamily("eas_edge_push_errors", "Failed streams and blocking queries to agents.",
                                  value=sum(feed.errors.values()) if feed else 0)
        sender = s.announcer
        batches = CounterMetricFamily("eas_edge_announce_batches", "Announce batches to node agents: sent (200), "
                                      "failed (no answer, a timeout, any other status), dropped (queued behind a "
                                      "failed batch or at shutdown, never sent).", labels=["result"])
        for result in ("sent", "failed", "dropped"):
            batches.add_metric([result], sender.batches[result] if sender else 0)
        yield batches
        announcements = CounterMetricFamily("eas_edge_announcements", "Requests announced to node agents: sent "
                                            "(accepted), dropped (failed, refused, during an agent's backoff, "
                                            "over a batch's cap: counted by time).", labels=["result"])
        for result in ("sent", "dropped"):
            announcements.add_metric([result], sender.announcements[result] if sender else 0)
        yield announcements
