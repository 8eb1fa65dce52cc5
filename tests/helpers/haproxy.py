"""HAProxy for the balancer's tests: the distribution's binary (installed when missing and root may), and what
it says of a server, read with ``show stat`` (not the module's ``show servers state``: an independent reading)."""

from __future__ import annotations

import csv
import os
import shutil
import socket
import subprocess

import pytest


def binary() -> str:
    """The haproxy binary; installed from Debian's archive when missing (root only), else the test is skipped."""
    found = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")
    if not found and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-qq", "haproxy"], env=env, capture_output=True, timeout=300)
        found = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")
    if not found:
        pytest.skip("haproxy is not installed and cannot be (apt-get install haproxy needs root)")
    return found


def command(socket_path: str, text: str) -> str:
    """One command on a stats socket; HAProxy answers and closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        conn.connect(socket_path)
        conn.sendall(text.encode() + b"\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer.decode()


def status(socket_path: str, backend: str, server: str) -> str:
    """The server's ``status`` column of ``show stat``: UP, DOWN, "DOWN 1/2" (going up), "UP 1/2", MAINT..."""
    rows = csv.DictReader(command(socket_path, "show stat").lstrip("# ").splitlines())
    return next(row["status"] for row in rows if row["pxname"] == backend and row["svname"] == server)


def connections(socket_path: str) -> int:
    """HAProxy's ``CumConns`` (``show info``): every connection it accepted, stats-socket ones included, this
    question's own among them."""
    for line in command(socket_path, "show info").splitlines():
        if line.startswith("CumConns:"):
            return int(line.split(":", 1)[1])
    raise ValueError(f"{socket_path}: show info has no CumConns")
