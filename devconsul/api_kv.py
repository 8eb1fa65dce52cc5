"""``/v1/kv/:key`` (https://developer.hashicorp.com/consul/api-docs/kv), after ``agent/kvs_endpoint.go``.

GET: one entry as a one-element list, 404 when missing (with query metadata); ``?recurse`` lists the
prefix sorted by key; ``?keys`` lists key names, cut after ``?separator``, ``[]`` rather than 404 for the
empty prefix; ``?raw`` returns the bare value. PUT: the body is the value; answers ``true`` or, with
``?cas``, whether the write happened. DELETE: ``?recurse`` deletes the prefix, ``?cas`` is checked.
A ``?cas`` or ``?flags`` that is not an unsigned integer is a 500, as in Consul (the parse error is
returned unwrapped there).
"""

from __future__ import annotations

from devconsul.authz import can, filtered
from devconsul.httpapi import ApiError, Request, Response, ascii_uint, blocking_read
from devconsul.kvstore import MAX_VALUE_SIZE, StoreFull
from devconsul.watch import kv_key, kv_prefix

PREFIX = "/v1/kv/"


def _uint(req: Request, name: str) -> int | None:
    if not req.has(name):
        return None
    text = req.get(name)
    value = ascii_uint(text)
    if value is None or value >= 2**64:
        raise ApiError(500, f'strconv.ParseUint: parsing "{text}": invalid syntax')
    return value


def _conflicting(req: Request, *flags: str) -> None:
    if sum(req.has(f) for f in flags) > 1:
        raise ApiError(400, "Conflicting flags: " + "&".join(sorted(req.query)) + "\n")


def handle(server, req: Request, key: str) -> Response:
    if req.method == "GET":
        return _get(server, req, key)
    if req.method == "PUT":
        return _put(server, req, key)
    if req.method == "DELETE":
        return _delete(server, req, key)
    raise ApiError(405, f"method {req.method} not allowed", {"Allow": "GET,PUT,DELETE"})


def _get(server, req: Request, key: str) -> Response:
    kv = server.kv
    if req.has("keys"):
        separator = req.get("separator", req.get("seperator"))

        def build_keys() -> Response:
            _, keys = kv.keys(key, separator)
            shown = [k for k in keys if can(req, "key", "read", k)]
            if not shown and key:
                return filtered(Response(404, raw=b""), len(shown) < len(keys))
            return filtered(Response(payload=shown), len(shown) < len(keys))

        return blocking_read(server, req, lambda: kv.prefix_index(key), build_keys, kv_prefix(key))
    if req.has("recurse"):
        def build_list() -> Response:
            _, entries = kv.list(key)
            shown = [e.to_api() for e in entries if can(req, "key", "read", e.key)]
            if not shown:
                return filtered(Response(404, raw=b""), len(shown) < len(entries))
            return filtered(Response(payload=shown), len(shown) < len(entries))

        return blocking_read(server, req, lambda: kv.prefix_index(key), build_list, kv_prefix(key))
    if not key:
        raise ApiError(400, "Missing key name")

    def build_one() -> Response:
        _, entry = kv.get(key)
        if entry is None:
            return Response(404, raw=b"")
        if req.has("raw"):
            return Response(
                raw=entry.value or b"", content_type="text/plain",
                headers={"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"},
            )
        return Response(payload=[entry.to_api()])

    return blocking_read(server, req, lambda: kv.get(key)[0], build_one, kv_key(key))


def _put(server, req: Request, key: str) -> Response:
    if not key:
        raise ApiError(400, "Missing key name")
    _conflicting(req, "cas", "acquire", "release")
    if req.has("acquire") or req.has("release"):
        raise ApiError(500, "Invalid session: sessions are not implemented by the dev server")
    flags = _uint(req, "flags") or 0
    cas = _uint(req, "cas")
    if len(req.body) > MAX_VALUE_SIZE:
        raise ApiError(
            413,
            f"Request body({len(req.body)} bytes) too large, max size: {MAX_VALUE_SIZE} bytes. See "
            "https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size.",
        )
    with server.state.lock:
        undo = server.kv.begin_undo()
        try:
            ok = server.kv.set(key, req.body, flags, cas)
        except StoreFull as exc:
            raise ApiError(413, str(exc)) from None
        finally:
            server.kv.end_undo()
    if ok:
        server.finish_write([("kv", key)], server.kv.undoer(undo))
    return Response(payload=ok)


def _delete(server, req: Request, key: str) -> Response:
    _conflicting(req, "recurse", "cas")
    cas = _uint(req, "cas")
    with server.state.lock:
        undo = server.kv.begin_undo()
        try:
            deleted, ok = _apply_delete(server, req, key, cas)
        finally:
            server.kv.end_undo()
    server.finish_write([("kv", k) for k in deleted], server.kv.undoer(undo))
    return Response(payload=ok)


def _apply_delete(server, req: Request, key: str, cas: int | None) -> tuple[list[str], bool]:
    if req.has("recurse"):
        return server.kv.delete_tree(key), True
    if not key:
        raise ApiError(400, "Missing key name")
    return [key], server.kv.delete(key, cas)
