"""``GET /scores`` on an agent, the two ways an edge follows it (the contract:
docs/contracts/scores-stream.md).

- **The stream**, ``GET /scores?stream=1``: one long answer of type :data:`STREAM_CONTENT_TYPE`, one score
  body (docs/contracts/score-body.md) per line, each as soon as the agent has it, and an empty line
  (:data:`HEARTBEAT`) after :data:`STREAM_HEARTBEAT_S` without one: a reader that hears nothing for longer
  than that (plus its own allowance) holds a dead stream. The agent ends a stream after at most
  :data:`MAX_STREAM_S` (the reader reconnects); the answer ends where the connection does.
- **The blocking query**, ``GET /scores?index=N&wait_s=S``: one body, its index in the :data:`INDEX_HEADER`
  header; when ``N`` is the current index the answer waits up to ``S`` seconds (at most :data:`MAX_WAIT_S`)
  for the next body. Index 0 with the body ``{}``: the agent has not finished its first cycle. An agent
  without streams answers ``?stream=1`` this way too (a plain ``application/json`` body), so a reader that
  gets no :data:`STREAM_CONTENT_TYPE` follows it with blocking queries.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from types import MappingProxyType
from urllib.parse import parse_qs

SCORES_PATH = "/scores"
STREAM_CONTENT_TYPE = "application/x-ndjson"
STREAM_HEARTBEAT_S = 5.0  # an empty line after this long without a body
# A stream is closed after this long and the reader reconnects: a follower that vanished without a FIN (its
# host died) holds an agent's thread at most this long even while its socket buffer still takes heartbeats.
MAX_STREAM_S = 300.0
HEARTBEAT = b"\n"
INDEX_HEADER = "X-Eas-Index"
MAX_WAIT_S = 30.0
DEFAULT_WAIT_S = 5.0
STREAM_PARAMS: Mapping[str, str] = MappingProxyType({"stream": "1"})  # the query that asks for the stream


def frame(body_json: bytes) -> bytes:
    """One body (its JSON, which never holds a newline: the agent writes compact JSON) as a stream line."""
    return body_json + b"\n"


def read_frame(line: bytes):
    """The decoded body of one stream line; None for a heartbeat (an empty line). Raises ValueError (or
    RecursionError for nesting past the decoder's limit) for a line that is not JSON."""
    if not line.strip():
        return None
    return json.loads(line)


def wants_stream(query: str) -> bool:
    """The ``/scores`` query asks for the stream (``stream=1`` or ``stream=true``)."""
    return parse_qs(query).get("stream", [""])[-1] in ("1", "true")


def blocking_params(index: int | None, wait_s: float) -> dict[str, str]:
    """The query of a blocking query after ``index`` (None: the first query, which answers at once)."""
    return {} if index is None else {"index": str(index), "wait_s": str(wait_s)}


def blocking_args(query: str) -> tuple[int | None, float]:
    """``index`` and ``wait_s`` of a ``/scores`` query; a missing or malformed value means "do not wait"."""
    args = parse_qs(query)
    try:
        index = int(args["index"][0])
        wait_s = min(MAX_WAIT_S, max(0.0, float(args.get("wait_s", [str(DEFAULT_WAIT_S)])[0])))
    except (KeyError, ValueError, IndexError):
        return None, 0.0
    return (index, wait_s) if math.isfinite(wait_s) else (None, 0.0)
