"""``PUT /v1/txn`` for KV operations (https://developer.hashicorp.com/consul/api-docs/txn).

All operations apply atomically under one index or none does: on any failure the store is rolled back
and the answer is 409 with ``Errors: [{OpIndex, What}]``; more than 64 operations is a 413. Results
list the entries read (with values) and written (values stripped, as Consul returns them). Node,
service, check and session operations are not implemented (400).
"""

from __future__ import annotations

import base64
import binascii

from devconsul.acl import AclError
from devconsul.authz import authz
from devconsul.definitions import canonical
from devconsul.httpapi import ApiError, Request, Response
from devconsul.kvstore import MAX_VALUE_SIZE, StoreFull

MAX_OPS = 64
READ_VERBS = ("get", "get-tree", "check-index", "check-session", "check-not-exists")
KV_FIELDS = ("Verb", "Key", "Value", "Flags", "Index", "Session")


def handle(server, req: Request) -> Response:
    if req.method != "PUT":
        raise ApiError(405, f"method {req.method} not allowed", {"Allow": "PUT"})
    ops = req.json_body()
    if not isinstance(ops, list):
        raise ApiError(400, "Failed to parse body: transaction must be a JSON list of operations")
    if len(ops) > MAX_OPS:
        raise ApiError(413, f"Transaction contains too many operations ({len(ops)} > {MAX_OPS})")
    kv_ops = []
    for op in ops:
        body = canonical(op, ("KV", "Node", "Service", "Check", "Session"))
        if "KV" not in body:
            raise ApiError(400, "Failed to parse body: the dev server implements KV operations only")
        kv_op = canonical(body["KV"], KV_FIELDS)
        try:
            value = base64.b64decode(kv_op.get("Value") or "", validate=True)
        except (binascii.Error, TypeError) as exc:
            raise ApiError(400, f"Failed to parse body: {exc}") from exc
        if len(value) > MAX_VALUE_SIZE:
            raise ApiError(413, f"Value for key {kv_op.get('Key')!r} is too large ({len(value)} > {MAX_VALUE_SIZE} bytes)")
        kv_ops.append((str(kv_op.get("Verb", "")), str(kv_op.get("Key", "")), value,
                       int(kv_op.get("Flags") or 0), int(kv_op.get("Index") or 0)))

    denied = []
    for n, (verb, key, *_) in enumerate(kv_ops):
        try:
            authz(req).require("key", "read" if verb in READ_VERBS else "write", key)
        except AclError as exc:
            denied.append({"OpIndex": n, "What": exc.reason})
    if denied:  # Consul vets every operation's ACL before applying any (txn_endpoint.go preCheck)
        return Response(409, {"Results": None, "Errors": denied})
    state, kv = server.state, server.kv
    with state.lock:
        saved_index = state.index
        results, errors, touched = [], [], []
        state.begin_batch()
        undo = kv.begin_undo()
        try:
            for n, (verb, key, value, flags, index) in enumerate(kv_ops):
                try:
                    what = _apply(kv, verb, key, value, flags, index, results, touched)
                except StoreFull as exc:
                    what = str(exc)
                if what:
                    errors.append({"OpIndex": n, "What": what})
        finally:
            state.end_batch()
            kv.end_undo()
        if errors:
            kv.rollback(undo)
            state.index = saved_index
            return Response(409, {"Results": None, "Errors": errors})
    if touched:
        server.finish_write([("kv", k) for k in touched], kv.undoer(undo))
    return Response(payload={"Results": results or None, "Errors": None})


def _apply(kv, verb, key, value, flags, index, results, touched) -> str:
    """Run one KV op; returns Consul's error text, or "" on success."""
    if verb in ("set", "cas"):
        if not kv.set(key, value, flags, index if verb == "cas" else None):
            return f'failed to set key "{key}", index is stale'
        touched.append(key)
        results.append({"KV": kv.get(key)[1].to_api(with_value=False)})
    elif verb in ("get", "check-index", "get-tree", "check-not-exists"):
        if verb == "get-tree":
            results.extend({"KV": e.to_api()} for e in kv.list(key)[1])
            return ""
        entry = kv.get(key)[1]
        if verb == "check-not-exists":
            return f'key "{key}" exists' if entry is not None else ""
        if entry is None:
            return f'key "{key}" doesn\'t exist'
        if verb == "check-index" and entry.modify_index != index:
            return f'current modify index {entry.modify_index} != {index}'
        results.append({"KV": entry.to_api(with_value=verb == "get")})
    elif verb in ("delete", "delete-cas"):
        if not kv.delete(key, index if verb == "delete-cas" else None):
            return f'failed to delete key "{key}", index is stale'
        touched.append(key)
    elif verb == "delete-tree":
        touched.extend(kv.delete_tree(key))
    elif verb in ("lock", "unlock", "check-session"):
        return f'sessions are not implemented by the dev server (verb "{verb}")'
    else:
        return f'unknown KV verb "{verb}"'
    return ""
