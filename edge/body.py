"""A completion request's body: read within a size cap, parsed, and reduced to what routing needs.

The edge forwards the client's bytes unchanged; from the decoded body it needs only the model, whether it
streams, the prompt's size (:mod:`edge.tokens`), the digest of OpenAI's ``user`` field (a session key under a
traffic rollout, :mod:`edge.rollout`; only the digest leaves) and the digest of the body's bytes (what places a
request without a session key, so that a client's retry of it lands on the same revision): :func:`summarize`
reduces it to a
:class:`BodySummary`, or to the 400 the client gets (invalid JSON, JSON nested deeper than the decoder
allows, not an object).

``json.loads`` holds the GIL for its whole run (~20 ms per MiB of token ids), so in a thread it would
stall the event loop as surely as on it: bodies over :data:`PARSE_IN_PROCESS_BYTES` are summarised in a
small process pool, and only the summary comes back. The workers come from multiprocessing's fork server
(a small process that imported only this module; the edge runs threads, so it never forks itself) and are
started with the edge (:meth:`BodyReader.start`): the fork server's own start, once per process, waits for
its imports, which must not happen on the event loop while requests are served. A semaphore bounds how many large bodies are read at once, so a crowd of big uploads
cannot hold ``max_connections`` x ``max_body_bytes`` in memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from eas_wire.rollout import body_digest, session_digest
from edge.pool.prefix import NO_PREFIX, PromptPrefix, prompt_prefix
from edge.tokens import estimate_prompt_tokens, prompt_parts

log = logging.getLogger("edge.body")
PARSE_IN_PROCESS_BYTES = 256 * 1024
PARSE_WORKERS = 2
LARGE_BODY_READS = 16


@dataclass(frozen=True)
class BodySummary:
    model: str | None = None
    stream: bool = False
    prompt_tokens: int | None = None
    prefix: PromptPrefix = NO_PREFIX  # the prompt's block hashes and conversation (edge/pool/prefix.py)
    user_session: bytes | None = None  # the digest of a non-empty string ``user`` (eas_wire/rollout.py)
    body_digest: bytes | None = None  # the digest of the body's bytes (eas_wire/rollout.py ``body_digest``)
    error: str | None = None  # why the body is a 400 (None: usable)
    reason: str | None = None  # the 400's machine-readable code


def summarize(raw: bytes, chat: bool) -> BodySummary:
    """What routing needs from a request body (pure; runs on the loop or in a worker process)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        return BodySummary(error="invalid JSON body: nested too deeply", reason="invalid_json")
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        return BodySummary(error=f"invalid JSON body: {exc}", reason="invalid_json")
    if not isinstance(body, dict):
        return BodySummary(error=f"invalid JSON body: expected an object, got {type(body).__name__}",
                           reason="invalid_json")
    model, user = body.get("model"), body.get("user")
    return BodySummary(model=model if isinstance(model, str) else None, stream=bool(body.get("stream")),
                       prompt_tokens=estimate_prompt_tokens(body, chat),
                       prefix=prompt_prefix(prompt_parts(body, chat)),
                       # JSON's \ud800 escapes decode to lone surrogates, which surrogatepass encodes
                       user_session=session_digest(user.encode("utf-8", "surrogatepass"))
                       if isinstance(user, str) and user else None,
                       body_digest=body_digest(raw))


def _warm_up(padding: bytes) -> BodySummary:
    time.sleep(0.05)  # long enough that the other warm-up task finds this worker busy and spawns another
    return summarize(b"{}" + padding, False)


class BodyTooLarge(Exception):
    pass


class BodyReader:
    """Reads and summarises request bodies for one edge (its process pool and its large-read semaphore)."""

    def __init__(self, max_body_bytes: int):
        self.max_body_bytes = max_body_bytes
        self.large_reads = asyncio.Semaphore(LARGE_BODY_READS)
        self.pool: ProcessPoolExecutor | None = None
        self.warming: list = []

    async def read(self, request) -> bytes:
        """The body, or :class:`BodyTooLarge` (from the declared length before reading, or while reading)."""
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            raise BodyTooLarge(length)
        if length is not None and length <= PARSE_IN_PROCESS_BYTES:
            return await self._read(request)
        async with self.large_reads:
            return await self._read(request)

    async def _read(self, request) -> bytes:
        from aiohttp import web

        try:
            return await request.read()  # aiohttp stops at client_max_size (= max_body_bytes)
        except web.HTTPRequestEntityTooLarge as exc:
            raise BodyTooLarge(self.max_body_bytes) from exc

    def start(self) -> BodyReader:
        """Start the parsing workers now: each is spawned when a task finds no idle one, so as many tasks
        as workers, each a summary (the worker imports this module once, at its first)."""
        if self.pool is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])
            self.pool = ProcessPoolExecutor(PARSE_WORKERS, mp_context=context)
            # a large argument, as a real task has: the first one pays for the pipes' and buffers' set-up
            padding = b" " * PARSE_IN_PROCESS_BYTES * 4
            self.warming = [self.pool.submit(_warm_up, padding) for _ in range(PARSE_WORKERS)]
        return self

    def ready(self) -> bool:
        """Whether every parsing worker has started (and imported this module)."""
        return self.pool is not None and all(f.done() for f in self.warming)

    async def summarize(self, raw: bytes, chat: bool) -> BodySummary:
        if len(raw) <= PARSE_IN_PROCESS_BYTES:
            return summarize(raw, chat)
        self.start()
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, summarize, raw, chat)
        except BrokenProcessPool:  # a worker died (killed, out of memory): a new pool for the next body
            log.error("a body parsing worker died; starting new ones")
            self.close()
            self.start()
            return summarize(raw, chat)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
