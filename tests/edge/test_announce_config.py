"""The edge's ``announce:`` config, its token file, its flag, and the edge id."""

from __future__ import annotations

import re
import socket

import pytest

from eas_wire.scorebody import EDGE_ID
from edge import announce as announce_module
from edge.announce import edge_id
from edge.config import AnnounceConfig, ConfigError, EdgeConfig, load_edge_config
from edge.main import Edge
from edge.main import main as edge_main
from tests.edge.helpers import free_port

SECRET = "s3cret-announce-token"


def token_file(tmp_path, text: str = SECRET + "\n", mode: int = 0o600):
    path = tmp_path / "announce.token"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_defaults_off_and_the_file_s_fields(tmp_path):
    config = load_edge_config(None)
    assert config.announce == AnnounceConfig() and not config.announce.enabled
    path = tmp_path / "edge.yml"
    path.write_text("announce:\n  token_file: /etc/eas-edge/announce.token\n  batch_ms: 25\n  edge_name: edge-a\n")
    announce = load_edge_config(path).announce
    assert announce == AnnounceConfig("/etc/eas-edge/announce.token", 25.0, "edge-a") and announce.enabled
    flagged = load_edge_config(path, {"announce.token_file": "/run/other.token"}).announce
    assert flagged.token_file == "/run/other.token" and flagged.batch_ms == 25.0


@pytest.mark.parametrize("text, message", [
    ("announce:\n  batch_ms: 0\n", "announce.batch_ms: must be 1-1000 (milliseconds), got 0"),
    ("announce:\n  batch_ms: 1001\n", "announce.batch_ms: must be 1-1000 (milliseconds), got 1001"),
    ("announce:\n  batch_ms: fast\n", "announce.batch_ms: expected a number, got str 'fast'"),
    ("announce:\n  token_file: ''\n", "announce.token_file: empty path (null turns announcing off)"),
    ("announce:\n  token: abc\n", "announce.token: unknown field"),
    ("announce: [1]\n", "announce: expected a mapping, got list"),
])
def test_field_errors_name_the_field(tmp_path, text, message):
    path = tmp_path / "edge.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_edge_config(path)
    assert str(info.value) == f"{path}: {message}" or str(info.value).startswith(f"{path}: {message}")


def test_batch_ms_bounds_are_inclusive(tmp_path):
    path = tmp_path / "edge.yml"
    for value in (1, 1000, 2.5):
        path.write_text(f"announce:\n  batch_ms: {value}\n")
        assert load_edge_config(path).announce.batch_ms == value


def test_announcing_without_the_push_feed_is_an_error_naming_both_fields(tmp_path):
    path = tmp_path / "edge.yml"
    path.write_text("push:\n  enabled: false\nannounce:\n  token_file: /etc/eas-edge/announce.token\n")
    with pytest.raises(ConfigError) as info:
        load_edge_config(path)
    assert str(info.value).startswith(f"{path}: announce.token_file: ") and "push.enabled" in str(info.value)
    with pytest.raises(ConfigError, match=r"<flags>: announce.token_file: announcing needs the push feed "
                                          r"\(push.enabled: true\)"):
        load_edge_config(None, {"announce.token_file": "/x.token", "push.enabled": False})


def test_the_flags_no_push_and_announce_token_file_exit_2_naming_both(capsys, tmp_path):
    path = token_file(tmp_path)
    assert edge_main(["--no-push", "--announce-token-file", str(path), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eas-edge: <flags>: announce.token_file: ") and "push.enabled" in err and "\n" not in err


@pytest.mark.parametrize("text, mode, message", [
    (None, 0o600, "cannot read the announce token file: No such file or directory"),
    (SECRET, 0o640, "readable by group/others (mode 0640); chmod 600 it (it holds the announce token)"),
    ("", 0o600, "must hold one announce token (found nothing)"),
    (f"{SECRET} {SECRET}", 0o600, "must hold one announce token (found whitespace)"),
])
def test_the_token_file_follows_the_token_file_rules_and_says_it_is_the_announce_token(tmp_path, capsys, text,
                                                                                        mode, message):
    path = tmp_path / "missing.token" if text is None else token_file(tmp_path, text, mode)
    with pytest.raises(ConfigError) as info:
        AnnounceConfig(token_file=str(path)).read_token("edge.yml")
    assert str(info.value) == f"edge.yml: announce.token_file: {path}: {message}"
    assert SECRET not in str(info.value) and "Consul" not in str(info.value)
    # eas-edge reads it at start, before Consul (nothing listens at that Consul address): one line, exit 2
    consul = f"127.0.0.1:{free_port()}"
    assert edge_main(["--announce-token-file", str(path), "--consul", consul, "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"eas-edge: <flags>: announce.token_file: {path}: {message}"


def test_a_good_token_file_is_read_and_turns_the_ledger_s_numbering_on(tmp_path):
    path = token_file(tmp_path)
    config = EdgeConfig(announce=AnnounceConfig(token_file=str(path)))
    assert config.announce.read_token() == SECRET
    assert Edge(config).state.router.ledger.announcing
    assert not Edge(EdgeConfig()).state.router.ledger.announcing


def test_edge_id_is_the_sanitized_name_and_a_new_nonce_each_time(monkeypatch):
    first, second = edge_id("edge-a"), edge_id("edge-a")
    assert re.fullmatch(r"edge-a\.[0-9a-f]{8}", first) and re.fullmatch(r"edge-a\.[0-9a-f]{8}", second)
    assert first != second
    assert edge_id("edge a/ü:1").startswith("edge-a--:1.")
    assert edge_id("..-edge").startswith("edge.")  # the id must start with a letter or digit
    assert re.fullmatch(r"edge\.[0-9a-f]{8}", edge_id("/// "))
    long = edge_id("x" * 200)
    assert len(long) == 80 and long.startswith("x" * 71 + ".")
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-edge-3.dc1.example")
    assert edge_id().startswith("gpu-edge-3.dc1.example.")
    monkeypatch.setattr(announce_module.secrets, "token_hex", lambda n: "0123abcd"[:2 * n])  # 4 bytes: 8 hex
    assert edge_id("e") == "e.0123abcd"
    for name in ("edge-a", "edge a/ü:1", "..-edge", "/// ", "x" * 200, None):
        assert EDGE_ID.fullmatch(edge_id(name))
