"""Hostile peers and strict readers the agent's and the pool reader's tests share: a real vLLM scrape
(``GOOD``) and one sample replaced, a JSON reader that refuses NaN/Infinity as a Go or JS reader would, a
server that drips its answer a byte at a time, and a loopback HTTP server for a block."""

from __future__ import annotations

import http.server
import json
import random
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

GOOD = (Path(__file__).parents[1] / "fixtures" / "vllm" / "v1_single_engine.txt").read_text()


def strict_json(text: str):
    """json.loads that fails on NaN/Infinity (what a Go or JS reader of the KV body would do)."""

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def replace_sample(text: str, name: str, value: str) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith(name + "{"):
            line = line.rsplit(" ", 1)[0] + f" {value}\n"
        out.append(line)
    assert out != text.splitlines(keepends=True), name
    return "".join(out)


class DripServer:
    """Answers every connection with a 200 header and then one body byte every ``every_s``."""

    def __init__(self, every_s=0.1, body_bytes=100_000, header_drip=False):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.every_s, self.body_bytes, self.header_drip = every_s, body_bytes, header_drip
        self.stopping = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn):
        try:
            conn.recv(65536)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {self.body_bytes}\r\n\r\n".encode()
            if self.header_drip:
                for i in range(len(head)):
                    conn.sendall(head[i : i + 1])
                    if self.stopping.wait(self.every_s):
                        return
            else:
                conn.sendall(head)
            for _ in range(self.body_bytes):
                conn.sendall(b"#")
                if self.stopping.wait(self.every_s):
                    return
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stopping.set()
        self.sock.close()


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    """An HTTP server on a loopback port with ``handler``, for as long as the block runs: yields the port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


VLLM = sorted((Path(__file__).parents[1] / "fixtures" / "vllm").glob("*.txt"))


VALUES = ["NaN", "+Inf", "-Inf", "-1", "-1e308", "1e308", "1e400", "0", "nan", "x", "", "1_0", "0x10", "--1"]


def hostile_scrape(rng: random.Random) -> str:
    text = rng.choice(VLLM).read_text()
    lines = text.split("\n")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        line = lines[i]
        if line.startswith("vllm:") and rng.random() < 0.7:
            lines[i] = line.rsplit(" ", 1)[0] + " " + rng.choice(VALUES)
        elif rng.random() < 0.5:
            lines[i] = line[: rng.randrange(len(line) + 1)]
        else:
            lines.insert(i, "".join(chr(rng.randrange(1, 0x250)) for _ in range(rng.randrange(0, 50))))
    return "\n".join(lines)
