"""The admin listener (``admin_listen``, loopback by default): ``/metrics`` for the operator's scraper.

It is a listener of its own so that clients, who reach the client port, never read the pool's topology,
per-IU load or tenants' request counts; firewall it to the monitoring hosts when it is not on loopback.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

REGISTRY = web.AppKey("registry", CollectorRegistry)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[REGISTRY]),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def make_admin_app(registry: CollectorRegistry) -> web.Application:
    app = web.Application()
    app[REGISTRY] = registry
    app.router.add_get("/metrics", _metrics)
    return app
