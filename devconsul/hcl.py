"""The HCL subset that Consul configuration files and ACL rules use, read with the standard library only.

``key = value``, ``block { }``, ``block "label" { }``, strings, numbers, booleans, lists and inline maps;
comments ``#``, ``//`` and ``/* */``. Repeated blocks merge (later values win), as Consul's config
loader merges fragments. Used by the consul stand-in (config files) and by the ACL policy rules
(https://developer.hashicorp.com/consul/docs/secure/acl/rule: "HCL ... interoperable with JSON").
"""

from __future__ import annotations

import json
import re

_TOKEN = re.compile(r"""
    (?P<ws>\s+|\#[^\n]*|//[^\n]*|/\*.*?\*/)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<word>[A-Za-z_][A-Za-z0-9_\-.]*)
  | (?P<punct>[{}\[\]=,:])
""", re.X | re.S)


class ConfigError(ValueError):
    pass


def _tokens(text: str, source: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            line = text.count("\n", 0, pos) + 1
            raise ConfigError(f"{source}:{line}: unexpected {text[pos:pos + 20]!r}")
        kind = match.lastgroup
        if kind != "ws":
            out.append((kind, match.group(), text.count("\n", 0, pos) + 1))
        pos = match.end()
    return out


def parse_hcl(text: str, source: str = "<hcl>") -> dict:
    """The HCL subset Consul configurations use: ``key = value``, ``block { }``, ``block "label" { }``, strings,
    numbers, booleans, lists and inline maps; comments ``#``, ``//`` and ``/* */``."""
    tokens = _tokens(text, source)
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else ("eof", "", tokens[-1][2] if tokens else 1)

    def take(kind=None, value=None):
        nonlocal pos
        token = peek()
        if (kind and token[0] != kind) or (value and token[1] != value):
            raise ConfigError(f"{source}:{token[2]}: expected {value or kind}, found {token[1] or 'end of file'!r}")
        pos += 1
        return token

    def value():
        kind, text_, line = peek()
        if kind == "str":
            take()
            return json.loads(text_)
        if kind == "num":
            take()
            return float(text_) if "." in text_ else int(text_)
        if kind == "word" and text_ in ("true", "false"):
            take()
            return text_ == "true"
        if text_ == "[":
            take()
            items = []
            while peek()[1] != "]":
                items.append(value())
                if peek()[1] == ",":
                    take()
            take(value="]")
            return items
        if text_ == "{":
            take()
            body = body_until("}")
            take(value="}")
            return body
        raise ConfigError(f"{source}:{line}: expected a value, found {text_!r}")

    def body_until(end):
        result: dict = {}
        while peek()[1] != end and peek()[0] != "eof":
            kind, key, line = take()
            if kind not in ("word", "str"):
                raise ConfigError(f"{source}:{line}: expected a key, found {key!r}")
            key = json.loads(key) if kind == "str" else key
            if peek()[1] in ("=", ":"):
                take()
                item = value()
            else:
                labels = []
                while peek()[0] == "str":
                    labels.append(json.loads(take()[1]))
                take(value="{")
                item = body_until("}")
                take(value="}")
                for label in reversed(labels):
                    item = {label: item}
            result[key] = merge(result.get(key), item)
            if peek()[1] == ",":
                take()
        if end == "eof" and peek()[0] != "eof":
            raise ConfigError(f"{source}:{peek()[2]}: unexpected {peek()[1]!r}")
        return result

    return body_until("eof")


def merge(old, new):
    if isinstance(old, dict) and isinstance(new, dict):
        merged = dict(old)
        for key, item in new.items():
            merged[key] = merge(merged.get(key), item)
        return merged
    return new


