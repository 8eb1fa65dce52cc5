"""The config field reader of the agent's and the edge's config files: typed access to one YAML mapping,
with errors that name the file and the field's dotted path (``edge.yml: push.agent_port: ...``), so both
files read and fail alike. The Consul block both files share is built on it in :mod:`consul_io.config`.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ConfigError", "Fields", "address", "read_yaml", "split_hostport"]


class ConfigError(Exception):
    """A config file problem: ``path: field: what is wrong``."""

    def __init__(self, path: str | Path, field_name: str, message: str):
        super().__init__(f"{path}: {field_name}: {message}")
        self.path = str(path)
        self.field = field_name


class Fields:
    """Typed access to one mapping of the YAML with errors that carry the field's dotted path."""

    def __init__(self, path: str | Path, data: Any, prefix: str):
        if not isinstance(data, dict):
            raise ConfigError(path, prefix or "(top level)", f"expected a mapping, got {type(data).__name__}")
        self.path, self.data, self.prefix = path, data, prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.path, self.name(key), message)

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., required: bool = False) -> Any:
        if key not in self.data or self.data[key] is None:
            if required or default is ...:
                raise self.fail(key, "required field is missing")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(key, f"expected {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(key, f"expected {_kind_name(kind)}, got {type(value).__name__} {value!r}")
        return value

    def positive(self, key: str, default: float) -> float:
        value = self.get(key, float, default)
        if value <= 0:
            raise self.fail(key, f"must be > 0, got {value}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.get(key, str, default)
        if value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def str_list(self, key: str) -> tuple[str, ...]:
        value = self.get(key, list, [])
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise ConfigError(self.path, f"{self.name(key)}[{i}]", f"expected a name, got {item!r}")
        return tuple(value)

    def unknown(self, known: set[str]) -> None:
        extra = sorted(set(self.data) - known)
        if extra:
            close = difflib.get_close_matches(str(extra[0]), sorted(known), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise self.fail(extra[0], f"unknown field ({hint}known: {', '.join(sorted(known))})")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def split_hostport(value: str) -> tuple[str, int]:
    """A HOST:PORT that :func:`address` accepted -> (host, port): the one reading of every address field (the
    Consul block, the agent's and the edge's listen); an IPv6 literal loses its brackets, as bind() wants."""
    host, _, port = value.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def address(fields: Fields, key: str, default: str) -> str:
    """The HOST:PORT field ``key`` (``default`` when absent)."""
    value = fields.get(key, str, default)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise fields.fail(key, f"expected HOST:PORT, got {value!r}")
    return value


def read_yaml(path: str | Path) -> Any:
    """The YAML document of the file at ``path`` (None when empty); an unreadable file or invalid YAML is a
    :class:`ConfigError` naming the file and the line."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(path, "(file)", f"cannot read: {exc.strerror or exc}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(yaml)"
        raise ConfigError(path, where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from exc
