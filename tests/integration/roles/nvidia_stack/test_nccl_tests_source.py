"""nvidia_stack's nccl-tests path (roles/nvidia_stack/tasks/nccl_tests.yml) run unchanged on this host with
connection local, everything under a temporary directory: a tarball is pinned by its sha256 (supply
chain: never unpacked unverified), each source builds in a directory of its own, and the
binaries preflight runs from PATH (`all_reduce_perf`) are linked there. The stand-in source
(helpers.nccl_tests_source) builds with make alone; nvcc cannot run here. The same path runs over SSH on a
machine inside site.yml (test_site_virtual.py: r02n01's host_vars)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.helpers.provision import ansible_playbook, nccl_tests_source

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[4]
BINARIES = ("all_reduce_perf", "all_gather_perf", "reduce_scatter_perf")

def run_role(tmp_path: Path, src: str, sha256: str, check: bool = False,
             proxy_env: dict | None = None) -> subprocess.CompletedProcess:
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "name": "nccl-tests", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "nccl-tests", "ansible.builtin.import_tasks":
                   str(REPO / "roles/nvidia_stack/tasks/nccl_tests.yml")}],
    }]))
    (tmp_path / "extra.json").write_text(json.dumps({
        "ansible_python_interpreter": sys.executable,
        "nvidia_stack_nccl_tests_src": src, "nvidia_stack_nccl_tests_sha256": sha256,
        "nvidia_stack_nccl_tests_dir": str(tmp_path / "opt"), "nvidia_stack_nccl_tests_bin_dir": str(tmp_path / "bin"),
        "nvidia_stack_nccl_tests_build_packages": [], "nvidia_stack_cuda_home": "/usr/local/cuda-12.4",
        "clusterctl_proxy_env": proxy_env or {},
    }))
    # no proxy but the one the role is given: sudo's env_reset leaves a host's fetches without the login's
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "no_proxy")}
    return ansible_playbook(Path("localhost,"), "-c", "local", str(play), "-e", f"@{tmp_path / 'extra.json'}",
                            *(["--check"] if check else []), env=env)


def recap(done: subprocess.CompletedProcess) -> dict[str, int]:
    match = re.search(r"localhost\s*:\s*(.*)", done.stdout.split("PLAY RECAP")[-1])
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


def flat(done: subprocess.CompletedProcess) -> str:
    return " ".join((done.stdout + done.stderr).split())


def test_a_pinned_tarball_is_built_linked_on_path_and_rerun_changes_nothing(tmp_path):
    sha = nccl_tests_source(tmp_path / "nccl-tests-2.13.11.tar.gz", "2.13.11")
    done = run_role(tmp_path, str(tmp_path / "nccl-tests-2.13.11.tar.gz"), sha.upper())
    assert done.returncode == 0, done.stdout[-3000:]
    out = subprocess.run([str(tmp_path / "bin/all_reduce_perf")], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "all_reduce_perf from 2.13.11 built with CUDA_HOME=/usr/local/cuda-12.4 MPI=0"
    assert os.readlink(tmp_path / "opt/build") == f"build-{sha[:16]}"
    assert {p.name for p in (tmp_path / "bin").iterdir()} == set(BINARIES)
    again = run_role(tmp_path, str(tmp_path / "nccl-tests-2.13.11.tar.gz"), sha)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]

    # A new source is built beside the old one, then the links switch to it.
    new = nccl_tests_source(tmp_path / "nccl-tests-2.14.1.tar.gz", "2.14.1")
    done = run_role(tmp_path, str(tmp_path / "nccl-tests-2.14.1.tar.gz"), new)
    assert done.returncode == 0, done.stdout[-3000:]
    out = subprocess.run([str(tmp_path / "bin/all_reduce_perf")], capture_output=True, text=True, check=True).stdout
    assert "from 2.14.1" in out
    assert (tmp_path / f"opt/build-{sha[:16]}/all_reduce_perf").exists()


def test_a_controller_tarball_with_another_sha256_is_refused_before_it_reaches_the_host(tmp_path):
    sha = nccl_tests_source(tmp_path / "nccl-tests.tar.gz", "2.13.11")
    wrong = hashlib.sha256(b"something else").hexdigest()
    done = run_role(tmp_path, str(tmp_path / "nccl-tests.tar.gz"), wrong)
    assert done.returncode != 0
    assert (f"{tmp_path / 'nccl-tests.tar.gz'} on the controller has sha256 {sha}, not "
            f"nvidia_stack_nccl_tests_sha256 {wrong}: not copied") in flat(done), done.stdout[-3000:]
    assert not (tmp_path / "opt").exists() and not (tmp_path / "bin").exists()


@pytest.mark.parametrize("sha256, shown", [("", "empty"), ("abc123", '"abc123"'), ("g" * 64, '"' + "g" * 64 + '"')])
def test_a_source_without_a_valid_sha256_is_never_built(tmp_path, sha256, shown):
    nccl_tests_source(tmp_path / "nccl-tests.tar.gz", "2.13.11")
    done = run_role(tmp_path, str(tmp_path / "nccl-tests.tar.gz"), sha256)
    assert done.returncode != 0
    assert (f"nvidia_stack_nccl_tests_sha256 is {shown}: set it to the tarball's sha256 (64 hex digits, "
            "`sha256sum FILE`); an unverified source is never built") in flat(done), done.stdout[-3000:]
    assert not (tmp_path / "opt").exists()


def test_a_relative_controller_path_is_refused(tmp_path):
    """copy would look in the role's files/ for it, stat in the working directory: not the same file."""
    done = run_role(tmp_path, "files/nccl-tests.tar.gz", "a" * 64)
    assert done.returncode != 0
    assert ("nvidia_stack_nccl_tests_src is files/nccl-tests.tar.gz: a tarball on the controller is named by its "
            "absolute path") in flat(done), done.stdout[-3000:]
    assert not (tmp_path / "opt").exists()


def test_a_missing_controller_tarball_is_named(tmp_path):
    done = run_role(tmp_path, str(tmp_path / "absent.tar.gz"), "a" * 64)
    assert done.returncode != 0
    assert f"{tmp_path / 'absent.tar.gz'} on the controller is not a regular file" in flat(done), done.stdout[-3000:]


@pytest.fixture
def served(tmp_path):
    """tmp_path/www over HTTP on loopback."""
    (tmp_path / "www").mkdir()
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "www"))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_downloaded_tarball_is_kept_only_when_its_sha256_matches(tmp_path, served):
    sha = nccl_tests_source(tmp_path / "www/nccl-tests.tar.gz", "2.13.11")
    bad = run_role(tmp_path, f"{served}/nccl-tests.tar.gz", hashlib.sha256(b"other").hexdigest())
    assert bad.returncode != 0 and "did not match" in flat(bad), bad.stdout[-3000:]
    assert list((tmp_path / "opt").glob("*.tar.gz")) == [] and not list((tmp_path / "opt").glob("build*"))

    done = run_role(tmp_path, f"{served}/nccl-tests.tar.gz", sha)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "bin/all_reduce_perf").exists()
    again = run_role(tmp_path, f"{served}/nccl-tests.tar.gz", sha)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]


def test_check_mode_on_a_fresh_host_reports_without_failing_or_writing(tmp_path):
    sha = nccl_tests_source(tmp_path / "nccl-tests.tar.gz", "2.13.11")
    done = run_role(tmp_path, str(tmp_path / "nccl-tests.tar.gz"), sha, check=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert recap(done)["changed"] > 0 and not (tmp_path / "opt").exists()


class ForwardProxy(http.server.BaseHTTPRequestHandler):
    """An HTTP proxy on loopback: answers a request for any absolute URL from its directory, by file name."""

    directory: Path
    asked: list[str]

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.asked.append(self.path)
        file = self.directory / self.path.rsplit("/", 1)[-1]
        if not self.path.startswith("http://") or not file.is_file():
            self.send_error(404)
            return
        body = file.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


def test_a_download_goes_through_the_proxy_the_role_is_given(tmp_path):
    """Where the host reaches the source only through the site's proxy (here: a loopback address where nothing
    listens), the fetch takes clusterctl_proxy_env; without it the download cannot connect."""
    (tmp_path / "www").mkdir()
    sha = nccl_tests_source(tmp_path / "www/nccl-tests.tar.gz", "2.13.11")
    handler = type("Handler", (ForwardProxy,), {"directory": tmp_path / "www", "asked": []})
    server = http.server.ThreadingHTTPServer(("127.0.71.3", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    src = "http://127.0.71.4:9/nccl-tests.tar.gz"  # unreachable directly
    try:
        direct = run_role(tmp_path, src, sha)
        assert direct.returncode != 0 and handler.asked == [], direct.stdout[-3000:]
        proxied = run_role(tmp_path, src, sha, proxy_env={"http_proxy": f"http://127.0.71.3:{server.server_address[1]}"})
    finally:
        server.shutdown()
        server.server_close()
    assert proxied.returncode == 0, proxied.stdout[-3000:]
    assert handler.asked == [src] and (tmp_path / "bin/all_reduce_perf").exists()
