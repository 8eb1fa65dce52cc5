"""What the edge's logs keep of a request head aiohttp refuses: the peer and the error, never the bytes."""

from __future__ import annotations

import logging
import sys

import pytest
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

from edge.limits import MalformedHeadLog

pytestmark = pytest.mark.unit


def refused(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except type(exc):
        return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                 ("127.0.73.9",), sys.exc_info())


@pytest.mark.parametrize("exc", [LineTooLong(b"sess-secret-" + b"x" * 9000, 8190),
                                 BadHttpMessage("Invalid header value char: b'sess-secret-\\x00'")])
def test_a_refused_head_is_one_line_without_the_clients_bytes(exc):
    record = refused(exc)
    assert MalformedHeadLog().filter(record)
    text = logging.Formatter().format(record)
    assert "secret" not in text and "\n" not in text
    assert text == f"refused a malformed request head from 127.0.73.9: {type(exc).__name__} (400)"


def test_other_records_pass_unchanged():
    record = refused(ValueError("the handler's own bug"))
    assert MalformedHeadLog().filter(record) and record.exc_info is not None
    assert record.getMessage() == "Error handling request from 127.0.73.9"
