"""Parser for ``dcgmi diag -r <level> -j`` (DCGM 3.x "DCGM GPU Diagnostic" and 4.x "DCGM Diagnostic" JSON).

Schema (kind ``dcgm-diag``)::

    {"version": "3.3.5", "tests": [{"category": "Hardware", "name": "GPU Memory", "status": "Fail",
      "results": [{"gpu": 0, "status": "Fail", "errors": [{"id": 56, "code": "DCGM_FR_MEMORY_ALLOC",
                                                            "message": "..."}]}]}]}

- ``status`` per test is DCGM 4's ``test_summary.status`` when printed, else the worst of its results
  (DCGM 3 has no summary); statuses are as printed: Pass, Fail, Warn, Skip, Not Run.
- ``errors``: DCGM 3 ``warnings`` ({"warning", "error_id"}) and DCGM 4 ``errors`` ({"msg"/"warning",
  "error_id", "entity_id"}), with ``code`` the ``DCGM_FR_*`` name of ``error_id`` from
  dcgmlib/dcgm_errors.h (None for an id the table does not know).
- A result's GPU is DCGM 3's ``gpu_id`` (a string of digits) or DCGM 4's ``entity_id``; Deployment
  (software) tests in DCGM 3 print one result without a GPU (``gpu`` None).

Layout sources: NVIDIA/DCGM#139 (3.x ``-r 3 -j``: ``test_categories`` / ``tests`` / ``results`` with
``gpu_id`` and ``status``), facebookresearch/gcm#38 (4.x key "DCGM Diagnostic", ``test_summary``).

Errors: text with no JSON object (dcgmi printed an error instead); JSON that does not decode (a cut
output: the decoder's line is named); an object without either diagnostic key or ``test_categories``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from preflight.parsers.common import Line, ParseError, first_nonblank, lines

# dcgmlib/dcgm_errors.h, dcgmError_enum (ids are append-only: "New error codes must be added to end").
FR_CODES = (
    "OK UNKNOWN UNRECOGNIZED PCI_REPLAY_RATE VOLATILE_DBE_DETECTED VOLATILE_SBE_DETECTED "
    "PENDING_PAGE_RETIREMENTS RETIRED_PAGES_LIMIT RETIRED_PAGES_DBE_LIMIT CORRUPT_INFOROM "
    "CLOCK_THROTTLE_THERMAL POWER_UNREADABLE CLOCK_THROTTLE_POWER NVLINK_ERROR_THRESHOLD NVLINK_DOWN "
    "NVSWITCH_FATAL_ERROR NVSWITCH_NON_FATAL_ERROR NVSWITCH_DOWN NO_ACCESS_TO_FILE NVML_API "
    "DEVICE_COUNT_MISMATCH BAD_PARAMETER CANNOT_OPEN_LIB DENYLISTED_DRIVER NVML_LIB_BAD GRAPHICS_PROCESSES "
    "HOSTENGINE_CONN FIELD_QUERY BAD_CUDA_ENV PERSISTENCE_MODE LOW_BANDWIDTH HIGH_LATENCY "
    "CANNOT_GET_FIELD_TAG FIELD_VIOLATION FIELD_THRESHOLD FIELD_VIOLATION_DBL FIELD_THRESHOLD_DBL "
    "UNSUPPORTED_FIELD_TYPE FIELD_THRESHOLD_TS FIELD_THRESHOLD_TS_DBL THERMAL_VIOLATIONS "
    "THERMAL_VIOLATIONS_TS TEMP_VIOLATION THROTTLING_VIOLATION INTERNAL PCIE_GENERATION PCIE_WIDTH ABORTED "
    "TEST_DISABLED CANNOT_GET_STAT STRESS_LEVEL CUDA_API FAULTY_MEMORY CANNOT_SET_WATCHES CUDA_UNBOUND "
    "ECC_DISABLED MEMORY_ALLOC CUDA_DBE MEMORY_MISMATCH CUDA_DEVICE ECC_UNSUPPORTED ECC_PENDING "
    "MEMORY_BANDWIDTH TARGET_POWER API_FAIL API_FAIL_GPU CUDA_CONTEXT DCGM_API CONCURRENT_GPUS "
    "TOO_MANY_ERRORS NVLINK_CRC_ERROR_THRESHOLD NVLINK_ERROR_CRITICAL ENFORCED_POWER_LIMIT MEMORY_ALLOC_HOST "
    "GPU_OP_MODE NO_MEMORY_CLOCKS NO_GRAPHICS_CLOCKS HAD_TO_RESTORE_STATE L1TAG_UNSUPPORTED "
    "L1TAG_MISCOMPARE ROW_REMAP_FAILURE UNCONTAINED_ERROR EMPTY_GPU_LIST DBE_PENDING_PAGE_RETIREMENTS "
    "UNCORRECTABLE_ROW_REMAP PENDING_ROW_REMAP BROKEN_P2P_MEMORY_DEVICE BROKEN_P2P_WRITER_DEVICE "
    "NVSWITCH_NVLINK_DOWN EUD_BINARY_PERMISSIONS EUD_NON_ROOT_USER EUD_SPAWN_FAILURE EUD_TIMEOUT EUD_ZOMBIE "
    "EUD_NON_ZERO_EXIT_CODE EUD_TEST_FAILED FILE_CREATE_PERMISSIONS PAUSE_RESUME_FAILED "
    "PCIE_H_REPLAY_VIOLATION GPU_EXPECTED_NVLINKS_UP NVSWITCH_EXPECTED_NVLINKS_UP XID_ERROR SBE_VIOLATION "
    "DBE_VIOLATION PCIE_REPLAY_VIOLATION SBE_THRESHOLD_VIOLATION DBE_THRESHOLD_VIOLATION "
    "PCIE_REPLAY_THRESHOLD_VIOLATION CUDA_FM_NOT_INITIALIZED SXID_ERROR GFLOPS_THRESHOLD_VIOLATION NAN_VALUE"
).split()
_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
_SEVERITY = {"Fail": 4, "Warn": 3, "Pass": 2, "Skip": 1, "Not Run": 0}


def fr_code(error_id: Any) -> str | None:
    return f"DCGM_FR_{FR_CODES[error_id]}" if isinstance(error_id, int) and 0 <= error_id < len(FR_CODES) else None


@dataclass(frozen=True)
class DiagError:
    id: int | None
    code: str | None
    message: str

    def to_json(self) -> dict:
        return {"id": self.id, "code": self.code, "message": self.message}


@dataclass(frozen=True)
class DiagResult:
    gpu: int | None
    status: str
    errors: list[DiagError] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "status": self.status, "errors": [e.to_json() for e in self.errors]}


@dataclass(frozen=True)
class DiagTest:
    category: str
    name: str
    status: str
    results: list[DiagResult]

    def to_json(self) -> dict:
        return {"category": self.category, "name": self.name, "status": self.status,
                "results": [r.to_json() for r in self.results]}


@dataclass(frozen=True)
class DcgmDiag:
    tests: list[DiagTest]
    version: str | None

    def to_json(self) -> dict:
        return {"version": self.version, "tests": [t.to_json() for t in self.tests]}


def parse(text: str) -> DcgmDiag:
    all_lines = lines(text)
    start = next((line for line in all_lines if line.text.lstrip().startswith("{")), None)
    if start is None:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no dcgmi diag -j output (a JSON object)")
    # By position, not by line number: a pasted elision marker ("[snip]", "...") is dropped from all_lines but
    # keeps its number, so numbers and positions differ after one.
    json_lines = all_lines[all_lines.index(start):]
    body = "\n".join(line.text for line in json_lines)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        shown = json_lines[min(exc.lineno, len(json_lines)) - 1]
        raise ParseError(shown.no, shown.text, f"dcgmi diag JSON does not decode ({exc.msg})") from None
    key = next((k for k in _KEYS if isinstance(data, dict) and k in data), None)
    diag = data.get(key) if key else None
    if not isinstance(diag, dict) or not isinstance(diag.get("test_categories"), list):
        raise ParseError(start.no, start.text, "JSON has no 'DCGM Diagnostic' / 'DCGM GPU Diagnostic' "
                                               "object with test_categories")
    tests = []
    for category in diag["test_categories"]:
        if not isinstance(category, dict) or not isinstance(category.get("tests"), list):
            raise ParseError(start.no, start.text, f"test category without tests: {str(category)[:80]}")
        for test in category["tests"]:
            tests.append(_test(str(category.get("category", "")), test, start))
    version = data.get("version") or diag.get("version") or (data.get("Metadata") or {}).get("DCGM Version")
    return DcgmDiag(tests, str(version) if version is not None else None)


def _test(category: str, test: Any, start: Line) -> DiagTest:
    if not isinstance(test, dict) or "name" not in test:
        raise ParseError(start.no, start.text, f"test without a name in {category}: {str(test)[:80]}")
    test_errors = [e for e in test.get("errors") or [] if isinstance(e, dict)]
    results = []
    for raw in test.get("results") or []:
        if not isinstance(raw, dict) or "status" not in raw:
            raise ParseError(start.no, start.text, f"{test['name']}: a result without a status")
        gpu = _gpu(raw.get("gpu_id", raw.get("entity_id")))
        mine = [e for e in test_errors if _gpu(e.get("entity_id")) == gpu] if gpu is not None else []
        errors = [_error(e) for e in (raw.get("warnings") or []) + (raw.get("errors") or []) + mine
                  if isinstance(e, dict)]
        results.append(DiagResult(gpu, str(raw["status"]), errors))
    summary = (test.get("test_summary") or {}).get("status")
    status = str(summary) if summary else max((r.status for r in results), key=lambda s: _SEVERITY.get(s, 0),
                                              default="Not Run")
    return DiagTest(category, str(test["name"]), status, results)


def _gpu(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _error(raw: dict) -> DiagError:
    error_id = raw.get("error_id")
    error_id = error_id if isinstance(error_id, int) and not isinstance(error_id, bool) else None
    message = raw.get("warning") or raw.get("msg") or raw.get("message") or ""
    return DiagError(error_id, fr_code(error_id), str(message))
