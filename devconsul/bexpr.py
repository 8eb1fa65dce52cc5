"""The subset of Consul's ``?filter=`` expressions (go-bexpr) the dev server evaluates.

From https://developer.hashicorp.com/consul/api-docs/features/filtering:

- matching operators: ``<Selector> == "<Value>"``, ``!=``, ``<Selector> is empty``, ``is not empty``,
  ``"<Value>" in <Selector>``, ``not in``, ``<Selector> contains "<Value>"``, ``not contains``,
  ``<Selector> matches "<regex>"``, ``not matches``;
- ``and``, ``or``, ``not`` and parentheses, with the usual precedence (not > and > or);
- values are double-quoted or backtick-quoted strings, or bare words/numbers (``Service.Port == 8000``);
- selectors are dotted field paths (``Service.Meta.node``; a map key may also be written
  ``Service.Meta["node-name"]``).

Semantics (as go-bexpr): ``in``/``contains`` test membership for a list and substring for a string; a
selector that passes through a list of objects (``Checks.Status``) yields the list of that field's
values, and ``==``/``matches`` are true when any value matches (``!=``/``not matches``: none does);
``is empty`` is true for a missing map key, an empty string, list or map. Numbers compare with a bare or
quoted value by their text (``Service.Port == "8000"``). A selector naming a field the endpoint does not
have is a 400 ``Selector "X" is not valid``, as in Consul; so is a syntax error.

``matches`` patterns are Go regexp (RE2) patterns in Consul, searched in linear time; here too
(:mod:`devconsul.linear_regex`): a pattern RE2 refuses (backreference, lookaround) is a 400, and no
pattern can make a search backtrack, so ``Service.ID matches "^(.*)*z$"`` cannot stall the server (the
filter runs under the state lock, while the answer is built).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from devconsul.httpapi import ApiError
from devconsul.linear_regex import Pattern, RegexError, compile_pattern

MAX_FILTER = 4096  # characters; a longer expression is refused (it is a query string, not a program)
_TOKEN = re.compile(
    r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<op>==|!=|\(|\)|\[|\]|\.)|(?P<word>[^\s()\[\]."`=!]+))"""
)


class FilterError(ApiError):
    def __init__(self, reason: str):
        super().__init__(400, reason)


@dataclass(frozen=True)
class Match:
    selector: tuple[str, ...]
    op: str  # == != empty notempty in notin matches notmatches
    value: str = ""
    pattern: Pattern | None = field(default=None, compare=False)  # matches / not matches


@dataclass(frozen=True)
class Not:
    expr: object


@dataclass(frozen=True)
class And:
    left: object
    right: object


@dataclass(frozen=True)
class Or:
    left: object
    right: object


def _unquote(kind: str, text: str) -> str:
    if kind == "raw":
        return text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text[1:-1])


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise FilterError(f"Failed to create boolean expression evaluator: syntax error at position {pos}")
        kind = m.lastgroup
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, tokens, fields):
        self.tokens, self.pos, self.fields = tokens, 0, fields

    def peek(self, n=0):
        i = self.pos + n
        return self.tokens[i] if i < len(self.tokens) else ("eof", "")

    def word(self, n=0) -> str:
        kind, text = self.peek(n)
        return text if kind == "word" else ""

    def take(self):
        tok = self.peek()
        self.pos += 1
        return tok

    def fail(self, what: str):
        kind, text = self.peek()
        near = "end of input" if kind == "eof" else repr(text)
        raise FilterError(f"Failed to create boolean expression evaluator: expected {what} at {near}")

    def expr(self):
        left = self.conj()
        while self.word() == "or":
            self.take()
            left = Or(left, self.conj())
        return left

    def conj(self):
        left = self.unary()
        while self.word() == "and":
            self.take()
            left = And(left, self.unary())
        return left

    def unary(self):
        if self.word() == "not":
            self.take()
            return Not(self.unary())
        if self.peek() == ("op", "("):
            self.take()
            inner = self.expr()
            if self.take() != ("op", ")"):
                self.fail("')'")
            return inner
        return self.match()

    def value(self) -> str:
        kind, text = self.peek()
        if kind in ("str", "raw"):
            self.take()
            return _unquote(kind, text)
        if kind == "word" and text not in ("and", "or", "not", "in", "is", "contains", "matches"):
            self.take()
            # a bare number like 8000 or 1.5 arrives as word "." word: join them
            while self.peek() == ("op", ".") and self.peek(1)[0] == "word":
                self.take()
                text += "." + self.take()[1]
            return text
        self.fail("a value")

    def selector(self) -> tuple[str, ...]:
        kind, text = self.peek()
        if kind != "word":
            self.fail("a selector")
        parts = [self.take()[1]]
        while True:
            if self.peek() == ("op", "."):
                self.take()
                if self.peek()[0] != "word":
                    self.fail("a field name")
                parts.append(self.take()[1])
            elif self.peek() == ("op", "["):
                self.take()
                kind, text = self.take()
                if kind not in ("str", "raw") or self.take() != ("op", "]"):
                    self.fail('["key"]')
                parts.append(_unquote(kind, text))
            else:
                break
        sel = tuple(parts)
        _check_selector(sel, self.fields)
        return sel

    def match(self):
        value_first = self.peek()[0] in ("str", "raw") or (
            self.peek()[0] == "word" and (self.word(1) == "in" or (self.word(1) == "not" and self.word(2) == "in"))
        )
        if value_first:  # "<Value>" [not] in <Selector>
            value = self.value()
            negate = self.word() == "not"
            if negate:
                self.take()
            if self.word() != "in":
                self.fail("'in'")
            self.take()
            return Match(self.selector(), "notin" if negate else "in", value)
        sel = self.selector()
        kind, text = self.peek()
        if (kind, text) in (("op", "=="), ("op", "!=")):
            self.take()
            return Match(sel, text, self.value())
        if text == "is":
            self.take()
            negate = self.word() == "not"
            if negate:
                self.take()
            if self.word() != "empty":
                self.fail("'empty'")
            self.take()
            return Match(sel, "notempty" if negate else "empty")
        negate = text == "not"
        if negate:
            self.take()
        if self.word() == "contains":
            self.take()
            return Match(sel, "notin" if negate else "in", self.value())
        if self.word() == "matches":
            self.take()
            text = self.value()
            try:
                pattern = compile_pattern(text)
            except RegexError as exc:
                raise FilterError(f"Failed to create boolean expression evaluator: invalid regex: {exc}") from None
            return Match(sel, "notmatches" if negate else "matches", text, pattern)
        self.fail("a matching operator")


def _check_selector(sel: tuple[str, ...], fields: dict) -> None:
    node: object = fields
    for i, part in enumerate(sel):
        if node == "map" and i == len(sel) - 1:  # free-form keys (Meta.<key>)
            return
        if not isinstance(node, dict) or part not in node:
            raise FilterError(f'Selector "{".".join(sel)}" is not valid')
        node = node[part]
    if isinstance(node, dict):
        raise FilterError(f'Selector "{".".join(sel)}" is not valid')


def parse(text: str, fields: dict):
    """Parse ``text`` for an endpoint whose entries have ``fields`` (nested dict; leaves are "value",
    "list" or "map"). Raises :class:`FilterError` (400)."""
    if len(text) > MAX_FILTER:
        raise FilterError(f"filter expression longer than {MAX_FILTER} characters")
    parser = _Parser(tokenize(text), fields)
    tree = parser.expr()
    if parser.peek()[0] != "eof":
        parser.fail("'and', 'or' or the end")
    return tree


def _resolve(obj, sel: tuple[str, ...]):
    """Values at ``sel``: a list when the path crosses a list of objects. ``_MISSING`` for a missing key."""
    if not sel:
        return obj
    head, rest = sel[0], sel[1:]
    if isinstance(obj, list):
        out = []
        for item in obj:
            value = _resolve(item, sel)
            if value is _MISSING:
                continue
            out.extend(value if isinstance(value, list) else [value])
        return out
    if isinstance(obj, dict):
        if head not in obj:
            return _MISSING
        return _resolve(obj[head], rest)
    return _MISSING


_MISSING = object()


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def evaluate(tree, obj) -> bool:
    if isinstance(tree, And):
        return evaluate(tree.left, obj) and evaluate(tree.right, obj)
    if isinstance(tree, Or):
        return evaluate(tree.left, obj) or evaluate(tree.right, obj)
    if isinstance(tree, Not):
        return not evaluate(tree.expr, obj)
    value = _resolve(obj, tree.selector)
    op = tree.op
    if op in ("empty", "notempty"):
        empty = value is _MISSING or value is None or (hasattr(value, "__len__") and len(value) == 0)
        return empty if op == "empty" else not empty
    if value is _MISSING or value is None:
        return op in ("!=", "notin", "notmatches")
    if op in ("in", "notin"):
        if isinstance(value, list):
            found = any(_text(v) == tree.value for v in value)
        elif isinstance(value, dict):
            found = tree.value in value
        else:
            found = tree.value in _text(value)
        return found if op == "in" else not found
    values = value if isinstance(value, list) else [value]
    if op in ("==", "!="):
        found = any(_text(v) == tree.value for v in values)
        return found if op == "==" else not found
    found = any(tree.pattern.search(_text(v)) for v in values)
    return found if op == "matches" else not found


# Selectors per endpoint (https://developer.hashicorp.com/consul/api-docs/health#filtering-2 and
# .../catalog#filtering-1); only the fields the dev server's answers carry.
_NODE = {"ID": "value", "Node": "value", "Address": "value", "Datacenter": "value",
         "TaggedAddresses": "map", "Meta": "map"}
_SERVICE = {"ID": "value", "Service": "value", "Tags": "list", "Address": "value", "Port": "value",
            "Meta": "map", "Kind": "value", "EnableTagOverride": "value", "Weights": {"Passing": "value",
                                                                                   "Warning": "value"}}
_CHECK = {"Node": "value", "CheckID": "value", "Name": "value", "Status": "value", "Notes": "value",
          "Output": "value", "ServiceID": "value", "ServiceName": "value", "ServiceTags": "list",
          "Type": "value"}
HEALTH_SERVICE_FIELDS = {"Node": _NODE, "Service": _SERVICE, "Checks": _CHECK}
HEALTH_CHECK_FIELDS = _CHECK  # one check of /v1/health/checks, /state and /node ("Filtering" under each)
CATALOG_SERVICE_FIELDS = {
    **{k: "value" for k in ("ID", "Node", "Address", "Datacenter", "ServiceID", "ServiceName", "ServiceAddress",
                            "ServicePort", "ServiceKind", "ServiceEnableTagOverride")},
    "TaggedAddresses": "map", "NodeMeta": "map", "ServiceTags": "list", "ServiceMeta": "map",
}


def apply(text: str, fields: dict, entries: list) -> list:
    tree = parse(text, fields)
    return [e for e in entries if evaluate(tree, e)]
