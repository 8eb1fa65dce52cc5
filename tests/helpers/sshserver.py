"""An SSH server inside the test process (paramiko's server mode over a socketpair: no network, no sshd):
the real protocol, channels, windows, EOF and exit status, for tests of preflight's SSH command loop."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import paramiko

_HOST_KEY: list = []


def _host_key():
    if not _HOST_KEY:  # one per test session: RSA generation is the slow part
        _HOST_KEY.append(paramiko.RSAKey.generate(2048))
    return _HOST_KEY[0]


class _Server(paramiko.ServerInterface):
    def __init__(self, handler: Callable[[paramiko.Channel, str], None], refuse_sessions: int = 0):
        self.handler = handler
        self.refuse_sessions = refuse_sessions  # the first N session requests are refused, as sshd's MaxSessions

    def get_allowed_auths(self, username):
        return "none"

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        if kind == "session" and self.refuse_sessions > 0:
            self.refuse_sessions -= 1
            return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        threading.Thread(target=self._run, args=(channel, command.decode()), daemon=True).start()
        return True

    def _run(self, channel, command):
        # The client closes stdin only once it has the exec reply: waiting for that EOF keeps the command
        # from closing the channel before the reply went out (sshd replies first; paramiko's server races).
        while channel.recv(1024):
            pass
        self.handler(channel, command)


def client_transport(handler: Callable[[paramiko.Channel, str], None], refuse_sessions: int = 0) -> paramiko.Transport:
    """An authenticated client transport whose every exec request runs ``handler(channel, command)`` on a
    server thread; the server refuses the first ``refuse_sessions`` channels. Close it when done (the server
    side ends with it)."""
    ours, theirs = socket.socketpair()
    server = paramiko.Transport(theirs)
    server.add_server_key(_host_key())
    started = threading.Thread(target=server.start_server, kwargs={"server": _Server(handler, refuse_sessions)}, daemon=True)
    started.start()
    client = paramiko.Transport(ours)
    client.start_client(timeout=30)
    client.auth_none("deploy")
    started.join(30)
    return client


def finish(channel: paramiko.Channel, status: int, eof_first: bool = True) -> None:
    """End a command as OpenSSH does (EOF, exit-status, close), or with the exit status first."""
    if eof_first:
        channel.shutdown_write()
        channel.send_exit_status(status)
    else:
        channel.send_exit_status(status)
        channel.shutdown_write()
    channel.close()
