"""Builders the check tests share: a default node and its profile, fixtures parsed by kind, one result's verdict."""

from __future__ import annotations

from preflight import parsers
from preflight.profiles import profile_of
from tests.helpers.preflight import fixture_text, node

N = node()
PROFILE = profile_of(N)


def parsed(kind: str, name: str, **kw):
    return parsers.PARSERS[kind](fixture_text(kind.replace("-", "_"), name), **kw)


def verdict(results):
    (result,) = results
    return result.verdict, result.code
