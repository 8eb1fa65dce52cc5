"""Parser for ``/etc/os-release``: which distribution and release a host runs.

Usage::

    from preflight.parsers import os_release
    found = os_release.parse(text)
    found.id, found.version_id, found.pretty_name      # ('ubuntu', '22.04', 'Ubuntu 22.04.5 LTS')

Schema (``OsRelease.to_json()``, kind ``os-release``)::

    {"id": "ubuntu", "version_id": "22.04", "version_codename": "jammy", "id_like": ["debian"],
     "pretty_name": "Ubuntu 22.04.5 LTS", "fields": {"NAME": "Ubuntu", "ID": "ubuntu", ...}}

The rules are os-release(5)'s (systemd, freedesktop.org): newline-separated ``KEY=value`` assignments
compatible with shell syntax; a value with spaces or special characters is in double or single quotes,
and inside double quotes ``\\"``, ``\\\\``, ``\\$`` and ``\\``` are escapes; lines starting with ``#`` are
comments; blank lines are ignored. Keys are ``[A-Z0-9_]``. ``ID`` defaults to ``linux`` when absent (the man
page's default); ``ID_LIKE`` is a space-separated list. A key given twice keeps its last value, as a shell
sourcing the file would.

Real example (Debian 12, from the base-files package)::

    PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
    NAME="Debian GNU/Linux"
    VERSION_ID="12"
    VERSION="12 (bookworm)"
    VERSION_CODENAME=bookworm
    ID=debian

Strict: a line that is not a comment and not ``KEY=value`` (an error message, a shell prompt's output, a
truncated quote) is a ParseError naming the line; a file with no assignment at all is a ParseError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import Line, ParseError, first_nonblank, is_prompt, lines

_ASSIGNMENT = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
_ESCAPE = re.compile(r'\\([\\"$`])')
_PLAIN = re.compile(r"^[A-Za-z0-9._+:/@,-]*$")  # an unquoted shell word without expansions or spaces


@dataclass(frozen=True)
class OsRelease:
    fields: dict[str, str]

    @property
    def id(self) -> str:
        return self.fields.get("ID", "linux")

    @property
    def version_id(self) -> str | None:
        return self.fields.get("VERSION_ID")

    @property
    def version_codename(self) -> str | None:
        return self.fields.get("VERSION_CODENAME")

    @property
    def id_like(self) -> list[str]:
        return self.fields.get("ID_LIKE", "").split()

    @property
    def pretty_name(self) -> str:
        return self.fields.get("PRETTY_NAME") or f"{self.fields.get('NAME', 'Linux')} {self.version_id or ''}".strip()

    def to_json(self) -> dict:
        return {"id": self.id, "version_id": self.version_id, "version_codename": self.version_codename,
                "id_like": self.id_like, "pretty_name": self.pretty_name, "fields": dict(self.fields)}


def _value(line: Line, raw: str) -> str:
    if raw[:1] == '"':
        if len(raw) < 2 or raw[-1] != '"' or re.search(r'(?<!\\)"', raw[1:-1]):
            raise ParseError(line.no, line.text, "unterminated or stray double quote")
        return _ESCAPE.sub(r"\1", raw[1:-1])
    if raw[:1] == "'":
        if len(raw) < 2 or raw[-1] != "'" or "'" in raw[1:-1]:
            raise ParseError(line.no, line.text, "unterminated or stray single quote")
        return raw[1:-1]
    if not _PLAIN.match(raw):
        raise ParseError(line.no, line.text, "a value with spaces or shell characters must be quoted")
    return raw


def parse(text: str) -> OsRelease:
    all_lines = lines(text)
    fields: dict[str, str] = {}
    for line in all_lines:
        stripped = line.text.strip()
        if not stripped or stripped.startswith("#") or is_prompt(stripped):
            continue
        match = _ASSIGNMENT.match(stripped)
        if match is None:
            raise ParseError(line.no, line.text, "not a KEY=value line of os-release(5)")
        fields[match.group(1)] = _value(line, match.group(2))
    if not fields:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no os-release assignment (a line such as 'ID=debian')")
    return OsRelease(fields)
