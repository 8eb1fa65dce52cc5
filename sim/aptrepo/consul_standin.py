#!/usr/bin/env python3
"""Stand-in /usr/bin/consul of the virtual cluster's consul package: the project's dev server behind Consul's CLI.

It is NOT Consul. It reads the agent configuration the way ``consul agent -config-dir`` does (every ``*.hcl`` and
``*.json`` file of each directory in lexical order, then each ``-config-file``; later values win, maps merge),
serves devconsul's HTTP API on ``client_addr``:``ports.http``, tells systemd it is ready (the unit is
``Type=notify``, as HashiCorp's is), re-reads its configuration on SIGHUP (``ExecReload``) and stops on SIGTERM.
Keys it does not act on (gossip, server, retry_join, TLS) are accepted and reported once at start, so the
rendered configuration is still checked for syntax. Subcommands: ``version``, ``agent``, ``validate``, ``keygen``.
Only the Python standard library is used: the machine's /usr/bin/python3 runs it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
from pathlib import Path

STANDIN_LIB = "/usr/lib/consul-standin"
ACTED_ON = {"data_dir", "client_addr", "ports", "acl", "log_level", "node_name", "datacenter"}

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
            result[key] = _merge(result.get(key), item)
            if peek()[1] == ",":
                take()
        if end == "eof" and peek()[0] != "eof":
            raise ConfigError(f"{source}:{peek()[2]}: unexpected {peek()[1]!r}")
        return result

    return body_until("eof")


def _merge(old, new):
    if isinstance(old, dict) and isinstance(new, dict):
        merged = dict(old)
        for key, item in new.items():
            merged[key] = _merge(merged.get(key), item)
        return merged
    return new


def load_config(dirs: list[str], files: list[str]) -> dict:
    paths: list[Path] = []
    for directory in dirs:
        paths += sorted(p for p in Path(directory).iterdir() if p.suffix in (".hcl", ".json") and p.is_file())
    paths += [Path(f) for f in files]
    config: dict = {}
    for path in paths:
        text = path.read_text()
        try:
            part = json.loads(text) if path.suffix == ".json" else parse_hcl(text, str(path))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}: {exc.msg}") from exc
        if not isinstance(part, dict):
            raise ConfigError(f"{path}: the top level must be an object")
        config = _merge(config, part)
    return config


def _args(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    dirs, files, rest = [], [], []
    it = iter(argv)
    for arg in it:
        name, _, inline = arg.lstrip("-").partition("=")
        if name in ("config-dir", "config-file"):
            (dirs if name == "config-dir" else files).append(inline or next(it, ""))
        else:
            rest.append(arg)
    return dirs, files, rest


def _notify(state: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(state.encode(), address)


def agent(argv: list[str]) -> int:
    dirs, files, _ = _args(argv)
    config = load_config(dirs, files)
    logging.basicConfig(level=str(config.get("log_level", "info")).upper().replace("TRACE", "DEBUG"),
                        format="%(asctime)s [%(levelname)s] consul-standin: %(message)s")
    log = logging.getLogger("consul-standin")
    ignored = sorted(set(config) - ACTED_ON)
    if ignored:
        log.info("stand-in accepts but does not act on: %s", ", ".join(ignored))
    sys.path.insert(0, STANDIN_LIB)
    from devconsul.server import DevConsulServer

    client = str(config.get("client_addr", "127.0.0.1")).split()[0]
    port = int((config.get("ports") or {}).get("http", 8500))
    acl = config.get("acl") or {}
    token = ((acl.get("tokens") or {}).get("initial_management")) if acl.get("enabled") else None
    server = DevConsulServer(addr=f"{client}:{port}", data_dir=config.get("data_dir"), acl_token=token)
    server.start()
    log.info("Consul stand-in (devconsul, not Consul) agent serving HTTP on %s", server.address)
    stop = threading.Event()

    def reload(*_):
        _notify("RELOADING=1")
        try:
            load_config(dirs, files)
            log.info("configuration reloaded")
        except (OSError, ConfigError) as exc:
            log.error("reload failed: %s", exc)
        _notify("READY=1")

    signal.signal(signal.SIGHUP, reload)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    _notify("READY=1")
    try:
        stop.wait()
    finally:
        _notify("STOPPING=1")
        server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    version_file = Path(STANDIN_LIB) / "VERSION"  # written by the package: the version it stands in for
    version = version_file.read_text().strip() if version_file.is_file() else "0.0.0"
    try:
        if command == "version":
            print(f"Consul v{version}\nRevision standin\nBuild Date 1970-01-01T00:00:00Z\n"
                  "Protocol 2 spoken by default, understands 2 to 3 (agent will automatically use protocol >2 "
                  "when speaking to compatible agents)")
            return 0
        if command == "agent":
            return agent(rest)
        if command == "validate":
            dirs = [a for a in rest if not a.startswith("-")]
            load_config([d for d in dirs if Path(d).is_dir()], [f for f in dirs if Path(f).is_file()])
            print("Configuration is valid!")
            return 0
        if command == "keygen":
            print(base64.b64encode(os.urandom(32)).decode())
            return 0
    except (OSError, ConfigError) as exc:
        print(f"==> {exc}", file=sys.stderr)
        return 1
    print("Usage: consul [--version] <command> [<args>]\n\nAvailable commands are: agent, keygen, validate, "
          "version (clusterctl stand-in)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
