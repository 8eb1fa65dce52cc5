"""The one Consul client of the project (py-consul 1.8): agent, edge, preflight, ``clusterctl scores``, the demo.

One error type: every failure (refused connection, timeout, HTTP error, an answer that is not JSON) is raised
as :class:`ConsulUnavailable`, whose message is one line naming the call and what went wrong, never the token.
Every call has a timeout (``timeout_s``, py-consul's ``connections_timeout``); blocking queries get
theirs from Consul's ``wait`` plus that timeout.

One token rule, :func:`resolve_token` ``(token, token_file)``, called by every reader: the token is the secret
itself when given (an ansible-vault value), else the one in ``token_file``, which must exist, hold one token
and not be readable by group or others (mode 0600), else there is none. A file that is configured but
missing is an error naming it, for the daemons too: running without a token against a Consul with ACLs on
only fails later, on every call. Who passes what: the controller (``clusterctl preflight``, the roles'
``consul_token`` filter, ``clusterctl scores``) the inventory's ``consul_token`` / ``consul_token_file``,
through :meth:`cluster.settings.Consul.operator_token`, which names the variable in its error; the agent and
the edge ``consul.token_file`` of their config (docs/contracts/agent-config.md; the roles write the vault
value there). ACL tokens are passed explicitly on every call (py-consul sends none on some endpoints).

One address rule (:func:`endpoint`): ``[SCHEME://]HOST:PORT``. A scheme written in the address (the
``CONSUL_HTTP_ADDR`` spelling of Consul's CLI) is kept, and one that contradicts the ``scheme`` a caller
passes is an error, never a silent downgrade to plain HTTP. The inventory has no scheme in its address
(``cluster/spec.py``): its scheme is ``consul_scheme``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import consul
import requests
from consul.callback import CB

from consul_io import iu_listing, layout
from eas_wire.private_file import read_private_text

DEFAULT_TIMEOUT_S = 2.0  # the agent and the edge; preflight gives 10 s (a loaded node answers slowly)


class ConsulUnavailable(Exception):
    """Consul could not answer the call (the message says which call and why, in one line)."""


class TokenError(ValueError):
    """A token given as a file that cannot be used; the message names the file and the problem."""


def read_token_file(path: str | Path, kind: str = "Consul") -> str:
    """The token in ``path``: refused when the file is missing, readable by group/others, empty or not one word.

    ``kind`` names the token in the errors: ``"Consul"`` (the default) the Consul ACL token; another word,
    e.g. ``"announce"`` (the edges' and agents' announce channel), "the announce token file"."""
    path = Path(path)
    secret = "Consul ACL token" if kind == "Consul" else f"{kind} token"
    text = read_private_text(path, f"the {kind} token file", f"the {secret}", error=TokenError)
    token = text.strip()
    if not token or any(c.isspace() for c in token):
        raise TokenError(f"{path}: must hold one {secret} (found {'nothing' if not token else 'whitespace'})")
    return token


def resolve_token(token: object = None, token_file: object = None) -> str | None:
    """The one token rule: ``token`` when set (the secret itself), else the token in ``token_file``
    (:func:`read_token_file`: it must exist, hold one token, mode 0600), else None (no token).

    Raises :class:`TokenError`, never echoing a secret.
    """
    text = "" if token is None else str(token).strip()
    if text:
        if any(c.isspace() for c in text):
            raise TokenError("the Consul ACL token holds whitespace (a vault value of one line is expected)")
        return text
    if token_file is None or str(token_file) == "":
        return None
    return read_token_file(str(token_file))


def go_duration(seconds: float) -> str:
    """Consul's duration syntax for ``wait`` and check TTLs."""
    return f"{int(round(seconds * 1000))}ms"


SCHEMES = ("http", "https")


def endpoint(address: str, scheme: str | None = None) -> tuple[str, str, int]:
    """``[SCHEME://]HOST:PORT`` -> (scheme, host, port): the scheme written in the address, else ``scheme``,
    else http. Raises ConsulUnavailable naming a bad address, or one whose scheme contradicts ``scheme``."""
    written, sep, bare = address.rpartition("://")
    if sep and written not in SCHEMES:
        raise ConsulUnavailable(f"Consul address {address!r}: the scheme must be http or https")
    if sep and scheme and written != scheme:
        raise ConsulUnavailable(f"Consul address {address!r} says {written} but the scheme given is {scheme}")
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConsulUnavailable(f"Consul address {address!r} is not HOST:PORT")
    return written or scheme or "http", host, int(port)


def _read_environment_once(http) -> None:
    """What requests reads from the environment on every call (the proxy variables, twice, ``~/.netrc``, the CA
    bundle variables: a third of a call's CPU, and the agent calls several times a second), read once for this
    client's one address and set on its session. A process's environment does not change under it: the calls go
    where they went (through ``HTTP(S)_PROXY`` unless ``NO_PROXY`` names the address, verified with
    ``REQUESTS_CA_BUNDLE`` when no CA file is given)."""
    session = http.session
    settings = session.merge_environment_settings(http.base_uri, {}, None, http.verify, None)
    session.proxies.update(settings["proxies"])
    http.verify = settings["verify"]
    if session.auth is None:
        session.auth = requests.utils.get_netrc_auth(http.base_uri)
    session.trust_env = False


class ConsulIO:
    def __init__(
        self,
        address: str = layout.DEFAULT_HTTP_ADDR,
        *,
        token: str | None = None,
        scheme: str | None = None,
        ca_file: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        dc: str | None = None,
    ):
        """``address``: ``[SCHEME://]HOST:PORT``; ``scheme``: http or https (:func:`endpoint`: the address's
        scheme, else this, else http; the two must agree)."""
        scheme, host, port = endpoint(address, scheme)
        self.address = f"{host}:{port}"
        self.scheme = scheme
        self.token = token
        self.timeout_s = timeout_s
        self.client = consul.Consul(
            host=host,
            port=port,
            token=token,
            scheme=scheme,
            verify=ca_file if ca_file else True,
            dc=dc,
            connections_timeout=timeout_s,
        )
        _read_environment_once(self.client.http)
        self.iu_listing = iu_listing.IUListing()

    def _call(self, what: str, fn, *args, with_token: bool = True, **kwargs):
        """``fn(*args, token=..., **kwargs)``; ``with_token=False`` for the few py-consul calls without a token
        argument (they send the client's own token, set at construction)."""
        try:
            return fn(*args, token=self.token, **kwargs) if with_token else fn(*args, **kwargs)
        # The cause stays chained (cli/neterr.py reads "connection refused" etc. from it); the message itself
        # never carries requests' URL text.
        except requests.Timeout as exc:
            raise ConsulUnavailable(f"{what}: no answer from {self.address} within {self.timeout_s:g}s") from exc
        except requests.ConnectionError as exc:
            raise ConsulUnavailable(
                f"{what}: connection refused or no route to {self.address} (is the Consul agent running?)"
            ) from exc
        except (consul.ConsulException, requests.RequestException, OSError, ValueError) as exc:
            first = (str(exc).splitlines() or [""])[0][:160]
            raise ConsulUnavailable(f"{what}: {type(exc).__name__}: {first}") from exc

    # -- KV -------------------------------------------------------------------------------------------
    def kv_read(self, key: str) -> tuple[int, str | None]:
        """(ModifyIndex, value) of ``key``; (0, None) when absent (CAS with 0 = create only)."""
        _, entry = self._call(f"GET kv/{key}", self.client.kv.get, key)
        if not entry:
            return 0, None
        value = entry.get("Value")
        return int(entry["ModifyIndex"]), value.decode() if isinstance(value, bytes) else value

    def kv_put(self, key: str, value: str) -> bool:
        return bool(self._call(f"PUT kv/{key}", self.client.kv.put, key, value))

    def kv_cas_write(self, key: str, value: str, cas: int) -> int | None:
        """Check-and-set ``key`` (``cas`` 0: create only) in one transaction: the entry's ModifyIndex after the
        write, which the next check-and-set needs, or None when ``cas`` was stale (another writer). A
        ``PUT kv/`` answers only true or false, so the index took a second request (a GET the servers answer).
        Consul answers a transaction's failed operations with 409 and says why per operation: a stale index is
        "failed to set key ..., index is stale", anything else (an ACL denial) is raised with Consul's words.
        py-consul's Txn.put sends no token, hence the request made here."""
        what = f"PUT txn (cas kv/{key})"
        ops = [{"KV": {"Verb": "cas", "Key": key, "Value": base64.b64encode(value.encode()).decode(), "Index": cas}}]
        code, text = self._call(what, self.client.http.put, lambda response: (response.code, response.body),
                                "/v1/txn", data=json.dumps(ops), headers=self.client.prepare_headers(self.token),
                                with_token=False)
        try:
            answer = json.loads(text) if code in (200, 409) else None
            if code == 200:
                return int(answer["Results"][0]["KV"]["ModifyIndex"])
            if code == 409:
                whats = [str(error.get("What", "")) for error in answer["Errors"]]
                if whats and all(w.endswith("index is stale") for w in whats):
                    return None
                raise ConsulUnavailable(f"{what}: refused: {'; '.join(whats)[:160]}")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise ConsulUnavailable(f"{what}: unexpected answer {code}: {str(text)[:160]!r}") from None
        raise ConsulUnavailable(f"{what}: {code} {str(text).strip()[:160]}")

    def kv_get_json(self, key: str) -> dict | None:
        _, entry = self._call(f"GET kv/{key}", self.client.kv.get, key)
        if not entry or not entry.get("Value"):
            return None
        try:
            return json.loads(entry["Value"])
        except ValueError as exc:
            excerpt = entry["Value"][:80]
            raise ConsulUnavailable(f"GET kv/{key}: the value is not JSON ({exc}): {excerpt!r}") from None

    def kv_list(self, prefix: str, index: int | None = None, wait_s: float | None = None) -> tuple[int, list]:
        """Entries under ``prefix`` (a blocking query when ``index`` is given)."""
        wait = go_duration(wait_s) if (index and wait_s) else None
        idx, entries = self._call(
            f"GET kv/{prefix}?recurse", self.client.kv.get, prefix, recurse=True, index=index or None, wait=wait
        )
        return int(idx or 0), entries or []

    def kv_entry(self, key: str, index: int | None = None, wait_s: float | None = None) -> tuple[int, list]:
        """``key``'s entry as a listing of at most one (a blocking query when ``index`` is given). Unlike a
        recursive listing, which Consul filters by the token's rights (a key it may not read looks absent), a
        key the token may not read is an error here."""
        wait = go_duration(wait_s) if (index and wait_s) else None
        idx, entry = self._call(f"GET kv/{key}", self.client.kv.get, key, index=index or None, wait=wait)
        return int(idx or 0), [entry] if entry else []

    # -- health and agent -----------------------------------------------------------------------------
    def health_service(
        self, index: int | None = None, wait_s: float | None = None, passing: bool = False
    ) -> tuple[int, list]:
        """Every IU instance with its checks: the entries of each node's service ``vllm-iu-<node>`` the token
        may read, as ``GET health/service/<name>`` lists them (``passing``: only entries whose checks all pass,
        as Consul's ``?passing``).

        Two requests list the cluster (``GET health/state/any``, ``GET catalog/services``); a service is read
        again only when they show it changed (:class:`consul_io.iu_listing.IUListing`). The index is the larger
        of the checks' and the service catalog's: Consul's indexes are one Raft sequence, so any later
        registration or check change answers with a larger one. With ``index`` the call first blocks on the
        checks (status, maintenance, a deregistration: what moves an IU in or out of rotation); a registration
        whose checks are unchanged (a new address) shows within ``wait_s``, when that query returns anyway."""
        wait = go_duration(wait_s) if (index and wait_s) else None
        checks_index, checks = self._call("GET health/state/any", self.client.health.state, "any",
                                          index=index or None, wait=wait, filter_expr=iu_listing.CHECKS_FILTER)
        services_index, services = self._call("GET catalog/services", self.client.catalog.services)

        def read(name: str) -> list:
            return self._call(f"GET health/service/{name}", self.client.health.service, name)[1]

        entries = self.iu_listing.refresh(checks or [], int(services_index or 0), services or {}, read)
        if passing:
            entries = [e for e in entries if iu_listing.all_passing(e)]
        return max(int(checks_index or 0), int(services_index or 0)), entries

    def node_ius(self, node: str) -> list:
        """``node``'s IU instances with their checks (``GET health/service/vllm-iu-<node>``: one request)."""
        name = layout.iu_service(node)
        _, entries = self._call(f"GET health/service/{name}", self.client.health.service, name)
        return entries or []

    def health_node(self, node: str) -> list:
        _, checks = self._call(f"GET health/node/{node}", self.client.health.node, node)
        return checks or []

    def leader(self) -> str:
        """The cluster's leader address, "" while there is none (``GET status/leader``)."""
        return self._call("GET status/leader", self.client.status.leader, with_token=False) or ""

    def agent_self(self) -> dict:
        """The agent's own configuration (``GET agent/self``)."""
        # py-consul's agent.self() sends no token at all, so under default deny every agent read as down
        # (agent:read missing): send the header ourselves.
        return self._call("GET agent/self", self.client.http.get, CB.json(), "/v1/agent/self",
                          headers=self.client.prepare_headers(self.token), with_token=False) or {}

    # -- agent services -------------------------------------------------------------------------------
    def register_service(self, name: str, service_id: str, address: str, port: int, *, tags: list[str], meta: dict,
                         http_check: str | None = None) -> None:
        """Register an IU instance of service ``name`` (its node's ``vllm-iu-<node>``) on this agent
        (provisioning does it with a definition file; the simulators and tests call this, through
        sim/vllm/registration.py)."""
        check = consul.Check.http(http_check, "1s", timeout="1s") if http_check else None
        self._call(
            f"register service {service_id}",
            self.client.agent.service.register,
            name,
            service_id=service_id,
            address=address,
            port=port,
            tags=tags,
            meta=meta,
            check=check,
        )

    def service_maintenance(self, service_id: str, enable: bool, reason: str = "") -> None:
        self._call(
            f"maintenance {service_id}",
            self.client.agent.service.maintenance,
            service_id,
            enable,
            reason=reason or None,
        )
