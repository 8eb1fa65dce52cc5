"""The stand-in nvidia-ml-py (sim/nvml_standin): the NVML calls the agent's NvmlBackend makes exist in it with
nvidia-ml-py's signatures, error classes and return shapes; the agent's own backend, reading through it, gets
the values of the file the simulated hardware writes; an ``eas-agent`` subprocess imports it as ``pynvml``."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml as real  # nvidia-ml-py as the controller installs it (no driver here: only its Python is read)
import pytest

from eas_agent.collectors import gpu as gpu_module
from sim import nvml_standin
from sim.vllm.fake_gpu import fake_gpus, write_fake_gpu_file

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
GPU_SOURCE = REPO / "eas_agent" / "collectors" / "gpu.py"


def nvml_names_the_agent_uses() -> set[str]:
    """Every attribute eas_agent/collectors/gpu.py reads from the bindings: ``nvml.X``, ``pynvml.X``,
    ``<anything>.nvml.X`` and ``getattr(nvml, "X", ...)``."""
    names = set()
    for node in ast.walk(ast.parse(GPU_SOURCE.read_text())):
        if isinstance(node, ast.Attribute) and (
            (isinstance(node.value, ast.Name) and node.value.id in ("nvml", "pynvml"))
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "nvml")
        ):
            names.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and isinstance(node.args[1], ast.Constant)):
            names.add(node.args[1].value)
    return names


def test_the_walk_finds_the_calls_the_backend_makes():
    used = nvml_names_the_agent_uses()
    assert {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetCount", "NVMLError",
            "NVMLError_GpuIsLost", "NVMLError_Unknown", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
            "NVML_VOLATILE_ECC", "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait",
            "nvmlEventSetFree", "nvmlEventTypeXidCriticalError", "NVMLError_Timeout"} <= used, used


@pytest.mark.parametrize("name", sorted(nvml_names_the_agent_uses()))
def test_every_name_the_agent_uses_is_nvidia_ml_pys(name):
    standin = nvml_standin.load("/nonexistent")
    ours, theirs = getattr(standin, name), getattr(real, name)
    if inspect.isclass(theirs):
        assert inspect.isclass(ours) and ours.__name__ == theirs.__name__
        assert issubclass(ours, standin.NVMLError) == issubclass(theirs, real.NVMLError)
    elif callable(theirs):
        assert inspect.signature(ours) == inspect.signature(theirs), name
    else:
        assert ours == theirs, name


def test_errors_are_nvidia_ml_pys_classes_codes_and_texts():
    standin = nvml_standin.load("/nonexistent")
    codes = {n: v for n, v in vars(standin).items() if n.startswith("NVML_ERROR_")}
    assert codes and all(getattr(real, n) == v for n, v in codes.items())
    for code in codes.values():
        ours, theirs = standin.NVMLError(code), real.NVMLError(code)
        assert type(ours).__name__ == type(theirs).__name__ and ours.value == theirs.value == code
        if code in real.NVMLError._errcode_to_string:  # the others' text comes from libnvidia-ml
            assert str(ours) == str(theirs)
        assert isinstance(standin.NVMLError_GpuIsLost(), standin.NVMLError)


@pytest.mark.parametrize("structure", ["c_nvmlMemory_t", "c_nvmlMemory_v2_t", "c_nvmlUtilization_t", "nvmlPciInfo_t"])
def test_answers_have_nvidia_ml_pys_fields(structure):
    standin = nvml_standin.load("/nonexistent")
    assert getattr(standin, structure)._fields_ == getattr(real, structure)._fields_
    assert standin.nvmlMemory_v2 == real.nvmlMemory_v2


def test_the_standin_needs_nothing_but_the_standard_library_and_python_310():
    """It runs on the machines' own Python, imported as pynvml from the agent's virtualenv."""
    tree = ast.parse(nvml_standin.MODULE_FILE.read_text(), feature_version=(3, 10))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_its_default_file_is_where_virtual_up_writes_the_machines_gpus():
    from sim.hosts.machine_paths import SIM_RUN_DIR
    from sim.hosts.state_dir import NVML_FILE

    standin = nvml_standin.load("/nonexistent")
    assert standin.DEFAULT_FILE == f"{SIM_RUN_DIR}/{NVML_FILE}"
    assert standin.FILE_ENV == nvml_standin.FILE_ENV


# ------------------------------------------------------------------ the agent's backend reading through it

def written(tmp_path: Path, gpus: list[dict]) -> Path:
    path = tmp_path / "nvml.json"
    write_fake_gpu_file(path, gpus)
    return path


def test_the_agents_nvml_backend_reads_the_files_values(tmp_path):
    gpus = fake_gpus(4, used_fraction=0.5, utilization=70)
    gpus[1]["ecc_volatile_uncorrectable"] = 2
    gpus[3]["ecc_volatile_uncorrectable"] = None  # ECC disabled: NVML says Not Supported
    backend = nvml_standin.nvml_backend(written(tmp_path, gpus))
    got = [(r.memory_total_mib, r.memory_used_mib, r.utilization_pct, r.ecc_volatile_uncorrectable, r.lost, r.error)
           for r in backend.read((0, 1, 2, 3))]
    assert got == [(81559, 40779, 70, ecc, False, None) for ecc in (0, 2, 0, None)]
    backend.close()


def test_the_agents_nvml_backend_reads_each_gpus_bus_id(tmp_path):
    """NVML's busId as the kernel log's XID lines name the GPU; a file without one: bus index + 1."""
    gpus = fake_gpus(2, bus_ids=["00000000:DB:00.0"])
    backend = nvml_standin.nvml_backend(written(tmp_path, gpus))
    assert [r.pci for r in backend.read((0, 1))] == [(0, 0xDB, 0), (0, 2, 0)]
    backend.close()


def test_a_lost_or_vanished_gpu_is_lost_and_a_changed_file_is_read_again(tmp_path):
    path = written(tmp_path, fake_gpus(4, utilization=70))
    backend = nvml_standin.nvml_backend(path)
    assert [r.utilization_pct for r in backend.read((0, 1, 2, 3))] == [70] * 4
    gpus = fake_gpus(3, utilization=20)
    gpus[2]["lost"] = True
    write_fake_gpu_file(path, gpus)  # GPU 2 fell off the bus, GPU 3 is gone altogether
    os.utime(path, ns=(1, 10**18))
    readings = backend.read((0, 1, 2, 3))
    assert [r.utilization_pct for r in readings[:2]] == [20, 20]
    assert [(r.lost, r.error) for r in readings[2:]] == [(True, "NVML: GPU is lost (clusterctl NVML stand-in: "
                                                         f"GPU {i} in {path})") for i in (2, 3)]
    never = backend.read((9,))[0]  # an index NVML never had is a bad argument, not a lost GPU
    assert not never.lost and never.error.startswith("NVML: Invalid Argument")


def test_two_backends_in_one_process_read_their_own_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = nvml_standin.nvml_backend(written(tmp_path / "a", fake_gpus(1, utilization=10)))
    two = nvml_standin.nvml_backend(written(tmp_path / "b", fake_gpus(1, utilization=90)))
    assert (one.read((0,))[0].utilization_pct, two.read((0,))[0].utilization_pct) == (10, 90)


@pytest.mark.parametrize("text", ["", "{}", '{"gpus": [{"index": "0"}]}', '{"gpus": [{"index": 0, "lost": false}]}',
                                  '{"gpus": [{"index": 0, "memory_total_mib": NaN, "memory_used_mib": 1, '
                                  '"utilization_gpu_pct": 1, "utilization_memory_pct": 1}]}', "[1]"])
def test_a_file_that_is_not_a_gpu_file_is_a_driver_not_loaded_naming_it(tmp_path, text):
    path = tmp_path / "nvml.json"
    path.write_text(text)
    with pytest.raises(gpu_module.GpuBackendError, match=f"Driver Not Loaded .*{path}: not a GPU file"):
        nvml_standin.nvml_backend(path)


def test_no_file_stops_the_agent_at_start_and_a_file_gone_later_is_an_error_not_lost(tmp_path):
    with pytest.raises(gpu_module.GpuBackendError, match=f"{tmp_path / 'absent.json'}: No such file"):
        nvml_standin.nvml_backend(tmp_path / "absent.json")
    path = written(tmp_path, fake_gpus(2))
    backend = nvml_standin.nvml_backend(path)
    path.unlink()
    reading = backend.read((0,))[0]
    assert not reading.lost and reading.error.startswith("NVML: Driver Not Loaded")


def test_calls_before_init_and_after_shutdown_are_uninitialized(tmp_path):
    standin = nvml_standin.load(written(tmp_path, fake_gpus(1)))
    with pytest.raises(standin.NVMLError_Uninitialized):
        standin.nvmlDeviceGetCount()
    standin.nvmlInit()
    handle = standin.nvmlDeviceGetHandleByIndex(0)
    assert standin.nvmlDeviceGetCount() == 1
    memory = standin.nvmlDeviceGetMemoryInfo(handle, version=standin.nvmlMemory_v2)
    assert (memory.version, memory.total, memory.free + memory.used) == (standin.nvmlMemory_v2, 81559 * 2**20,
                                                                         81559 * 2**20)
    with pytest.raises(standin.NVMLError_NotSupported):  # the file has volatile uncorrectable counts only
        standin.nvmlDeviceGetTotalEccErrors(handle, standin.NVML_MEMORY_ERROR_TYPE_CORRECTED, 1)
    standin.nvmlShutdown()
    with pytest.raises(standin.NVMLError_Uninitialized):
        standin.nvmlDeviceGetUtilizationRates(handle)
    with pytest.raises(standin.NVMLError_Uninitialized):
        standin.nvmlShutdown()


def test_an_agent_subprocess_imports_the_standin_as_pynvml(tmp_path):
    """What an ``eas-agent run`` subprocess of the tests and benchmarks gets: the agent's own GPU read
    (``python -m eas_agent.collectors.gpu``, NvmlBackend over ``import pynvml``) answers from the file."""
    path = written(tmp_path, fake_gpus(2, utilization=55))
    env = nvml_standin.agent_env(path, {**os.environ, "PYTHONPATH": str(REPO)})
    done = subprocess.run([sys.executable, "-m", "eas_agent.collectors.gpu"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [g["utilization_pct"] for g in json.loads(done.stdout)["gpus"]] == [55, 55]
    where = subprocess.run([sys.executable, "-c", "import pynvml; print(pynvml.__file__)"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=60)
    assert Path(where.stdout.strip()) == nvml_standin.MODULE_FILE
