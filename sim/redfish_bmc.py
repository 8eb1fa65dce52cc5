"""Stand-in BMCs: the Redfish resources cpu_cstates reads and writes, with each vendor's rules, over HTTPS.

A :class:`FakeBmc` keeps a BIOS's current attributes and its pending settings (what applies at the next boot),
serves the Systems collection, the System, the Bios and its settings object, and the BIOS attribute registry,
and takes PATCHes of the settings object. It answers the way the real services do where a client can get it
wrong, including how they fail. A personality is one vendor's resources; :func:`behind_hgx_baseboard` and
:func:`requiring_if_match` add what a platform or a BMC firmware adds to any of them.

Behaviour table (what the stand-in does, where the real behaviour is documented):

| behaviour | stand-in | source |
|---|---|---|
| the Bios resource names its registry (``AttributeRegistry``) and links its settings object (``@Redfish.Settings.SettingsObject``) | every personality | DMTF Redfish-Mockup-Server ``public-rackmount1/Systems/437XR1138R2/Bios`` and ``Bios/Settings`` |
| the registry is found through ``/redfish/v1/Registries``: the member named after ``AttributeRegistry``, its ``Location[].Uri``, the file's ``RegistryEntries.Attributes[].Value[].ValueName`` | every personality | Lenovo's ``lenovo/python-redfish-lenovo`` ``examples/get_bios_attribute_metadata.py``; DMTF AttributeRegistry schema |
| a value that is not one of the registry's ``ValueName`` s is a 400 and the whole PATCH is lost | every personality | DMTF Base registry ``PropertyValueNotInList``; community.general ``redfish_utils`` (a 400 fails the request) |
| an attribute the BIOS does not have is a 400 ``PropertyUnknown`` | every personality | DMTF Base registry |
| Lenovo XCC's Redfish enum values are the registry's ``ValueName`` s without blanks (``MaximumPerformance``, ``CustomMode``); ``Custom Mode`` is the Setup/ASU display name | :func:`lenovo` | ``lenovo/python-redfish-lenovo`` (``set_bios_attribute ... OperatingModes_ChooseOperatingMode MaximumPerformance``); public XCC scripts PATCH ``{"OperatingModes_ChooseOperatingMode": "CustomMode"}`` to ``Bios/Pending`` |
| Lenovo XCC: the settings object is ``Bios/Pending``; XCC1 spells ``Enable``/``Disable``; C-state switches are read-only unless the operating mode is ``CustomMode`` | :func:`lenovo` | public XCC scripts ("Lenovo uses /Bios/Pending, NOT /Bios/Settings"); XCC presets lock the individual C-state settings |
| Dell iDRAC needs ``@Redfish.SettingsApplyTime`` to create the BIOS job; ``ProcCStates``/``ProcC1E`` only with ``SysProfile: Custom`` | :func:`dell` | Dell iDRAC Redfish BIOS scripts (``BiosSetAttributeREDFISH``) |
| HPE iLO: ``@odata.id`` values end in ``/``; ``MinProcIdlePower``/``MinProcIdlePkgState`` read-only unless ``WorkloadProfile: Custom`` | :func:`hpe` | HPE iLO 5/6 Redfish docs (``HewlettPackard/ilo-rest-api-docs``, BIOS resources) |
| Supermicro: attribute names carry a per-BIOS hash suffix (``CPUC6Report#0840``); the settings object is ``Bios/SD``, the name AMI-based BMC firmware gives it | :func:`supermicro` | Supermicro Redfish reference guide (BIOS attributes); github.com/ansible-collections/community.general/pull/6434 (``Systems/Self/Bios/SD`` on an AMI-based BMC) |
| an HGX platform's BMC lists the GPU baseboard (``HGX_Baseboard_0``, Manufacturer NVIDIA, no ``Bios``) among the Systems, also first | :func:`behind_hgx_baseboard` | public Redfish client fixtures of HGX systems: ``Systems`` = ``[Self, HGX_Baseboard_0]`` (Gigabyte HGX), ``System_0``, ``HGX_Baseboard_0`` (Supermicro GB300); OpenBMC/NVIDIA bmcweb serves ``/redfish/v1/Systems/HGX_Baseboard_0``; the collection's order is not specified |
| a Redfish client picks the System that has a ``Bios`` when there are several | :func:`behind_hgx_baseboard` | ``lenovo/python-redfish-lenovo`` ``get_bios_attribute_metadata.py`` ("if len(system) > 1 and 'Bios' not in ...: continue") |
| the settings object has an ETag (``ETag`` header, ``@odata.etag``), weak on AMI (``W/"..."``); it changes with every accepted PATCH | every personality | DMTF DSP0266 (ETags); github.com/stmcginnis/gofish/pull/175 (``Etag: W/"93227b24"`` on ``Bios/Settings``) |
| an ``If-Match`` that does not match the current ETag is a 412 Precondition Failed | every personality | DSP0266; RFC 9110 13.1.1; github.com/ansible-collections/community.general/pull/6434 ("the If-Match precondition failed") |
| a BMC that requires ``If-Match``: AMI MegaRAC answers 428 ``Ami.1.0.PreconditionHeaderMissing`` without it, Huawei iBMC 412 | :func:`requiring_if_match` | github.com/stmcginnis/gofish/issues/171 (Lenovo SR655, "AMI Redfish Server"); github.com/ansible/ansible/pull/56150 (428 on Lenovo); github.com/ansible/ansible/issues/60031 (Huawei iBMC, 412) |
| wrong credentials are a 401 | every personality | DSP0266 (authentication) |
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

USER, PASSWORD = "root", "bmc-Pa55-word-for-test"
REGISTRIES = "/redfish/v1/Registries"


class FakeBmc:
    """One vendor's Redfish BIOS resources. ``allowed`` is the attribute registry (attribute -> its
    ``ValueName`` s); ``gated`` = (gate attribute, gate value, attributes read-only unless the gate is set)."""

    def __init__(self, manufacturer: str, system: str, bios: str, settings: str, current: dict[str, str],
                 allowed: dict[str, list[str]], gated: tuple[str, str, set[str]] | None = None,
                 apply_time_required: bool = False, registry: str = "BiosAttributeRegistry.v1_0_0"):
        self.manufacturer, self.system, self.bios, self.settings = manufacturer, system, bios, settings
        self.current = dict(current)
        self.allowed = allowed
        self.gated = gated
        self.apply_time_required = apply_time_required
        self.registry = registry
        self.other_systems: list[dict] = []  # Systems listed before the host's own (an HGX baseboard)
        self.system_has_bios = True
        self.if_match_missing_status: int | None = None  # None: If-Match optional
        self.weak_etag = False
        self.generation = 1
        self.pending: dict[str, str] = {}
        self.patches: list[dict] = []
        self.if_match_seen: list[str | None] = []
        self.rejected: list[str] = []
        self.unauthorized = 0
        self.address = ""
        self.on_request: Callable[[tuple], None] = lambda client: None

    @property
    def etag(self) -> str:
        return f'W/"{self.generation:08x}"' if self.weak_etag else f'"{self.generation:08x}"'

    def registry_file(self) -> str:
        return f"{REGISTRIES}/{self.registry}/{self.registry}.json"

    def check(self, body: dict) -> str | None:
        attributes = body.get("Attributes", {})
        for name, value in attributes.items():
            if name not in self.current:
                return f"PropertyUnknown: {name}"
            if name in self.allowed and value not in self.allowed[name]:
                return f"PropertyValueNotInList: {name}={value}"
        if self.gated:
            gate, gate_value, locked = self.gated
            next_boot = {**self.current, **self.pending, **attributes}
            if next_boot[gate] != gate_value and locked & set(attributes):
                return f"PropertyNotWritable: {sorted(locked & set(attributes))} unless {gate}={gate_value}"
        if self.apply_time_required and "@Redfish.SettingsApplyTime" not in body:
            return "no @Redfish.SettingsApplyTime: no BIOS job would be scheduled"
        return None

    def precondition(self, if_match: str | None) -> tuple[int, str] | None:
        if if_match is None:
            if self.if_match_missing_status is None:
                return None
            return self.if_match_missing_status, (
                "PreconditionHeaderMissing: the request did not provide the required precondition, such as an "
                "If-Match or If-None-Match header")
        if if_match != "*" and if_match != self.etag:
            return 412, f"PreconditionFailed: the ETag supplied ({if_match}) did not match {self.etag}"
        return None

    def resources(self) -> dict[str, dict]:
        registry_entries = [{"AttributeName": name, "Type": "Enumeration", "ReadOnly": False,
                             "Value": [{"ValueName": v, "ValueDisplayName": v} for v in values]}
                            for name, values in self.allowed.items()]
        host = {"@odata.id": self.system, "Manufacturer": self.manufacturer, "SystemType": "Physical"}
        systems = [*self.other_systems, {**host, "Bios": {"@odata.id": self.bios}} if self.system_has_bios else host]
        return {
            "/redfish/v1/Systems": {"Members": [{"@odata.id": s["@odata.id"]} for s in systems]},
            **{s["@odata.id"]: s for s in systems},
            self.bios: {"@odata.id": self.bios, "AttributeRegistry": self.registry, "Attributes": self.current,
                        "@Redfish.Settings": {"SettingsObject": {"@odata.id": self.settings}}},
            self.settings: {"@odata.id": self.settings, "@odata.etag": self.etag, "Attributes": self.pending},
            REGISTRIES: {"Members": [{"@odata.id": f"{REGISTRIES}/Base.1.15.0"},
                                     {"@odata.id": f"{REGISTRIES}/{self.registry}"}]},
            f"{REGISTRIES}/{self.registry}": {"Id": self.registry, "Registry": self.registry,
                                               "Location": [{"Language": "en", "Uri": self.registry_file()}]},
            self.registry_file(): {"@odata.type": "#AttributeRegistry.v1_3_0.AttributeRegistry",
                                   "Id": self.registry, "RegistryEntries": {"Attributes": registry_entries}},
        }

    def handler(self) -> type[BaseHTTPRequestHandler]:
        bmc = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _authorized(self) -> bool:
                bmc.on_request(self.client_address)
                expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    bmc.unauthorized += 1
                    self._json({"error": {"code": "Base.1.15.NoValidSession"}}, 401)
                    return False
                return True

            def _json(self, body: dict, status: int = 200, etag: str | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if etag:
                    self.send_header("ETag", etag)
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str) -> None:
                bmc.rejected.append(message)
                self._json({"error": {"code": message.split(":")[0], "message": message}}, status)

            def do_GET(self):
                if not self._authorized():
                    return
                resources = bmc.resources()
                if self.path in resources:
                    self._json(resources[self.path], etag=bmc.etag if self.path == bmc.settings else None)
                else:
                    self._json({"error": f"not found: {self.path}"}, 404)

            def do_PATCH(self):
                if not self._authorized():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != bmc.settings:
                    self._json({"error": f"not found: {self.path}"}, 404)
                    return
                bmc.patches.append(body)
                bmc.if_match_seen.append(self.headers.get("If-Match"))
                failed = bmc.precondition(self.headers.get("If-Match"))
                if failed:
                    self._error(*failed)
                    return
                error = bmc.check(body)
                if error:
                    self._error(400, error)
                    return
                bmc.pending.update(body["Attributes"])
                bmc.generation += 1
                self._json({}, 202)

        return Handler


def serve(fake: FakeBmc, cert: str, key: str, host: str) -> ThreadingHTTPServer:
    """Serve ``fake`` over HTTPS on ``host`` (an ephemeral port); ``fake.address`` becomes host:port."""
    server = ThreadingHTTPServer((host, 0), fake.handler())
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    fake.address = f"{host}:{server.server_address[1]}"
    return server


def dell() -> FakeBmc:
    s = "/redfish/v1/Systems/System.Embedded.1"
    return FakeBmc("Dell Inc.", s, f"{s}/Bios", f"{s}/Bios/Settings",
                   {"SysProfile": "PerfPerWattOptimizedDapc", "ProcCStates": "Enabled", "ProcC1E": "Disabled",
                    "LogicalProc": "Enabled"},
                   {"SysProfile": ["PerfPerWattOptimizedDapc", "PerfOptimized", "Custom"],
                    "ProcCStates": ["Enabled", "Disabled"], "ProcC1E": ["Enabled", "Disabled"],
                    "LogicalProc": ["Enabled", "Disabled"]},
                   gated=("SysProfile", "Custom", {"ProcCStates", "ProcC1E"}), apply_time_required=True,
                   registry="BiosAttributeRegistry.v1_0_0")


def hpe() -> FakeBmc:
    return FakeBmc("HPE", "/redfish/v1/Systems/1/", "/redfish/v1/Systems/1/Bios/", "/redfish/v1/Systems/1/Bios/Settings/",
                   {"WorkloadProfile": "GeneralPowerEfficientCompute", "MinProcIdlePower": "C6",
                    "MinProcIdlePkgState": "C6Retention"},
                   {"WorkloadProfile": ["GeneralPowerEfficientCompute", "LowLatency", "Custom"],
                    "MinProcIdlePower": ["C6", "C1E", "NoCStates"],
                    "MinProcIdlePkgState": ["C6Retention", "C6NonRetention", "NoState"]},
                   gated=("WorkloadProfile", "Custom", {"MinProcIdlePower", "MinProcIdlePkgState"}),
                   registry="BiosAttributeRegistryU30.v1_2_68")


def supermicro() -> FakeBmc:
    s = "/redfish/v1/Systems/1"
    return FakeBmc("Supermicro", s, f"{s}/Bios", f"{s}/Bios/SD",
                   {"CPUC6Report#0840": "Enable", "EnhancedHaltState(C1E)#0841": "Disable",
                    "PackageCState#0843": "C6(Retention) state", "Hyper-Threading#0021": "Enable"},
                   {"CPUC6Report#0840": ["Enable", "Disable", "Auto"],
                    "EnhancedHaltState(C1E)#0841": ["Enable", "Disable"],
                    "PackageCState#0843": ["C0/C1 state", "C2 state", "C6(Retention) state", "Auto"],
                    "Hyper-Threading#0021": ["Enable", "Disable"]},
                   registry="BiosAttributeRegistry.1.0.0")


def lenovo() -> FakeBmc:
    s = "/redfish/v1/Systems/1"
    return FakeBmc("Lenovo", s, f"{s}/Bios", f"{s}/Bios/Pending",
                   {"OperatingModes_ChooseOperatingMode": "MaximumEfficiency", "Processors_CStates": "Enable",
                    "Processors_C1EnhancedMode": "Enable"},
                   {"OperatingModes_ChooseOperatingMode": ["MaximumEfficiency", "MaximumPerformance", "CustomMode"],
                    "Processors_CStates": ["Enable", "Disable"], "Processors_C1EnhancedMode": ["Enable", "Disable"]},
                   gated=("OperatingModes_ChooseOperatingMode", "CustomMode",
                          {"Processors_CStates", "Processors_C1EnhancedMode"}),
                   registry="BiosAttributeRegistry.1.0.0")


def behind_hgx_baseboard(fake: FakeBmc, boards: int = 1) -> FakeBmc:
    """``fake``'s System behind an HGX platform's BMC: the GPU baseboard(s) listed first among the Systems."""
    fake.other_systems = [{"@odata.id": f"/redfish/v1/Systems/HGX_Baseboard_{n}", "Id": f"HGX_Baseboard_{n}",
                           "Manufacturer": "NVIDIA", "SystemType": "Physical",
                           "Processors": {"@odata.id": f"/redfish/v1/Systems/HGX_Baseboard_{n}/Processors"}}
                          for n in range(boards)]
    return fake


def requiring_if_match(fake: FakeBmc, missing_status: int = 428) -> FakeBmc:
    """``fake`` behind a BMC firmware that refuses a PATCH without ``If-Match``: 428 as AMI MegaRAC answers,
    412 as Huawei iBMC does; its ETags weak, as AMI's are."""
    fake.if_match_missing_status = missing_status
    fake.weak_etag = True
    return fake


# personality -> the one PATCH a correct client sends to it from the state above (no If-Match, no other keys)
EXPECTED_PATCH = {
    "dell": {"Attributes": {"SysProfile": "Custom", "ProcCStates": "Disabled"},
             "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"}},
    "hpe": {"Attributes": {"WorkloadProfile": "Custom", "MinProcIdlePower": "NoCStates",
                           "MinProcIdlePkgState": "NoState"}},
    "supermicro": {"Attributes": {"CPUC6Report#0840": "Disable", "PackageCState#0843": "C0/C1 state"}},
    "lenovo": {"Attributes": {"OperatingModes_ChooseOperatingMode": "CustomMode",
                              "Processors_CStates": "Disable", "Processors_C1EnhancedMode": "Disable"}},
}
PERSONALITIES: dict[str, Callable[[], FakeBmc]] = {"dell": dell, "hpe": hpe, "supermicro": supermicro, "lenovo": lenovo}
