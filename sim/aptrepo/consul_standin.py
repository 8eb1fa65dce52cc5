#!/usr/bin/env python3
"""Stand-in /usr/bin/consul of the virtual cluster's consul package: the project's dev server behind Consul's CLI.

It is NOT Consul. ``consul agent -config-dir=D`` reads every ``*.hcl`` and ``*.json`` file of each directory in
lexical order, then each ``-config-file`` (later values win, maps merge; every ``service``/``services`` entry
of every file is a service definition, as Consul collects them), and runs devconsul as the agent that
configuration describes (``devconsul.agentconfig`` lists the keys acted on and what is only validated):
a server (``server = true``: the catalog, the ACL store, client membership; it also listens on
``bind_addr``:``ports.server`` for the client agents) or a client agent joined to ``retry_join`` (agent
endpoints on ``client_addr``:``ports.http``, checks run on the node, anti-entropy to the server). It tells
systemd it is ready (the unit is ``Type=notify``, as HashiCorp's is), reloads on SIGHUP (``ExecReload``) or
``consul reload`` (file services, ACL tokens and log level; other keys need a restart, said in the log), and
on SIGTERM leaves the cluster first when ``leave_on_terminate`` (the default for clients).

Subcommands: ``version``, ``agent``, ``validate``, ``keygen``, and the HTTP clients ``reload``, ``leave``,
``members``, ``maint`` (``-enable``/``-disable`` ``[-service=ID]`` ``[-reason=TEXT]``), which use
``CONSUL_HTTP_ADDR`` and ``CONSUL_HTTP_TOKEN`` / ``CONSUL_HTTP_TOKEN_FILE`` (or ``-http-addr``, ``-token``,
``-token-file``) as Consul's CLI does. Only the Python standard library is used: the machine's python3 runs it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import socket
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

STANDIN_LIB = "/usr/lib/consul-standin"
if Path(STANDIN_LIB, "devconsul").is_dir():  # installed by the package; in a checkout, PYTHONPATH finds it
    sys.path.insert(0, STANDIN_LIB)

from devconsul.agentconfig import AgentConfigError, from_config  # noqa: E402
from devconsul.hcl import ConfigError, merge, parse_hcl  # noqa: E402

__all__ = ["ConfigError", "load_config", "main", "parse_hcl"]
ACTED_ON = {"data_dir", "client_addr", "ports", "acl", "log_level", "node_name", "datacenter", "server",
            "bootstrap_expect", "bind_addr", "advertise_addr", "retry_join", "leave_on_terminate", "encrypt",
            "tls", "auto_encrypt", "services", "check_update_interval"}
RELOADABLE = {"services", "acl", "log_level"}


def load_config(dirs: list[str], files: list[str]) -> dict:
    paths: list[Path] = []
    for directory in dirs:
        paths += sorted(p for p in Path(directory).iterdir() if p.suffix in (".hcl", ".json") and p.is_file())
    paths += [Path(f) for f in files]
    config: dict = {}
    services: list = []
    for path in paths:
        text = path.read_text()
        try:
            part = json.loads(text) if path.suffix == ".json" else parse_hcl(text, str(path))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}: {exc.msg}") from exc
        if not isinstance(part, dict):
            raise ConfigError(f"{path}: the top level must be an object")
        for key in ("service", "services"):  # each definition counts; they never merge into each other
            value = part.pop(key, None)
            services += value if isinstance(value, list) else [value] if isinstance(value, dict) else []
        config = merge(config, part)
    if services:
        config["services"] = services
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


LOG_LEVELS = {"trace": "DEBUG", "debug": "DEBUG", "info": "INFO", "warn": "WARNING", "err": "ERROR", "error": "ERROR"}


def _log_level(config: dict) -> str:
    level = str(config.get("log_level", "info")).lower()
    if level not in LOG_LEVELS:
        raise AgentConfigError(f"log_level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
    return LOG_LEVELS[level]


def agent(argv: list[str]) -> int:
    dirs, files, _ = _args(argv)
    config = load_config(dirs, files)
    settings = from_config(config)
    logging.basicConfig(level=_log_level(config), format="%(asctime)s [%(levelname)s] consul-standin: %(message)s")
    log = logging.getLogger("consul-standin")
    ignored = sorted(set(config) - ACTED_ON)
    if ignored:
        log.info("stand-in accepts but does not act on: %s", ", ".join(ignored))
    if settings.gossip_key or settings.tls.get("ca_file"):
        log.info("gossip key and TLS files validated; the stand-in does not encrypt gossip or RPC")
    from devconsul.agent import load_file_services
    from devconsul.server import DevConsulServer

    server = DevConsulServer(addr=f"{settings.client_addr}:{settings.http_port}", data_dir=settings.data_dir,
                             agent=settings)
    server.start()
    server.finish_write(load_file_services(server, settings.services))
    log.info("Consul stand-in (devconsul, not Consul) %s %s serving HTTP on %s", "server" if settings.server
             else "client agent", settings.node_name, server.address)
    stop = threading.Event()
    reload_lock = threading.Lock()

    def reload() -> None:
        nonlocal config
        with reload_lock:
            _notify("RELOADING=1")
            try:
                fresh = load_config(dirs, files)
                new = from_config(fresh)
                server.finish_write(load_file_services(server, new.services))
                for kind, token in new.tokens.items():
                    if kind != "initial_management" and server.agent_tokens.get(kind) != token:
                        server.agent_tokens.set(kind, token)
                logging.getLogger().setLevel(_log_level(fresh))
                changed = sorted(k for k in set(fresh) | set(config)
                                 if k not in RELOADABLE and fresh.get(k) != config.get(k))
                if changed:
                    log.warning("reloaded; these changes need a restart: %s", ", ".join(changed))
                else:
                    log.info("configuration reloaded")
                config = fresh
            except (OSError, ConfigError, AgentConfigError, ValueError) as exc:
                log.error("reload failed, keeping the running configuration: %s", exc)
                raise
            finally:
                _notify("READY=1")

    def on_sighup(*_) -> None:
        threading.Thread(target=_quiet(reload), name="reload", daemon=True).start()

    server.on_reload = reload
    server.on_leave = stop.set
    signal.signal(signal.SIGHUP, on_sighup)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    _notify("READY=1")
    try:
        stop.wait()
    finally:
        _notify("STOPPING=1")
        server.stop()
    return 0


def _quiet(fn):
    def run() -> None:
        try:
            fn()
        except Exception:  # already logged by reload; a signal handler thread has nobody to tell
            pass
    return run


# -- HTTP client subcommands ---------------------------------------------------------------------------

def _http_options(argv: list[str]) -> tuple[str, str, list[str]]:
    addr = os.environ.get("CONSUL_HTTP_ADDR", "127.0.0.1:8500")
    token = os.environ.get("CONSUL_HTTP_TOKEN", "")
    token_file = os.environ.get("CONSUL_HTTP_TOKEN_FILE", "")
    rest = []
    for arg in argv:
        name, _, value = arg.lstrip("-").partition("=")
        if name == "http-addr":
            addr = value
        elif name == "token":
            token = value
        elif name == "token-file":
            token_file = value
        else:
            rest.append(arg)
    if token_file and not token:
        token = Path(token_file).read_text().strip()
    if "://" not in addr:
        addr = "http://" + addr
    return addr.rstrip("/"), token, rest


def _call(method: str, addr: str, path: str, token: str, query: dict | None = None) -> bytes:
    url = addr + path + ("?" + urllib.parse.urlencode(query) if query else "")
    request = urllib.request.Request(url, method=method, headers={"X-Consul-Token": token} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        raise ConfigError(f"Unexpected response code: {exc.code} ({exc.read().decode(errors='replace')})") from None
    except urllib.error.URLError as exc:
        raise ConfigError(f"Error connecting to Consul agent: {exc.reason}") from None


def client_command(command: str, argv: list[str]) -> int:
    addr, token, rest = _http_options(argv)
    flags = {a.lstrip("-").partition("=")[0]: a.partition("=")[2] for a in rest}
    if command == "reload":
        _call("PUT", addr, "/v1/agent/reload", token)
        print("Configuration reload triggered")
    elif command == "leave":
        _call("PUT", addr, "/v1/agent/leave", token)
        print("Graceful leave complete")
    elif command == "members":
        members = json.loads(_call("GET", addr, "/v1/agent/members", token))
        status = {1: "alive", 2: "leaving", 3: "left", 4: "failed"}
        print("Node  Address  Status")
        for m in members:
            print(f"{m['Name']}  {m['Addr']}:{m['Port']}  {status.get(m['Status'], m['Status'])}")
    elif command == "maint":
        if ("enable" in flags) == ("disable" in flags):
            raise ConfigError("Only one of -enable or -disable may be provided")
        query = {"enable": "true" if "enable" in flags else "false"}
        if flags.get("reason"):
            query["reason"] = flags["reason"]
        service = flags.get("service")
        _call("PUT", addr, f"/v1/agent/service/maintenance/{service}" if service else "/v1/agent/maintenance",
              token, query)
        what = f"service: {service}" if service else "node"
        print(f"{'Service' if service else 'Node'} maintenance is now {'enabled' if 'enable' in flags else 'disabled'}"
              f" ({what})")
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
            paths = [a for a in rest if not a.startswith("-")]
            from_config(load_config([d for d in paths if Path(d).is_dir()], [f for f in paths if Path(f).is_file()]))
            print("Configuration is valid!")
            return 0
        if command == "keygen":
            print(base64.b64encode(os.urandom(32)).decode())
            return 0
        if command in ("reload", "leave", "members", "maint"):
            return client_command(command, rest)
    except (OSError, ConfigError, AgentConfigError, ValueError) as exc:
        print(f"==> {exc}", file=sys.stderr)
        return 1
    print("Usage: consul [--version] <command> [<args>]\n\nAvailable commands are: agent, keygen, leave, maint, "
          "members, reload, validate, version (clusterctl stand-in)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
