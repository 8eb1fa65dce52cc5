"""The edge's ``announce:`` config, its key file, its flag, the edge id, ``debug_headers`` and
``rollout_request_key``."""

from __future__ import annotations

import re
import socket

import pytest

from eas_wire.scorebody import EDGE_ID
from eas_wire.signing import generate_key_pair, key_id, private_text
from edge import announce as announce_module
from edge.announce import edge_id
from edge.config import AnnounceConfig, ConfigError, EdgeConfig, load_edge_config
from edge.main import Edge, parse_args
from edge.main import main as edge_main
from tests.helpers.edge import free_port

pytestmark = pytest.mark.unit

SECRET, PUBLIC = generate_key_pair()


def key_file(tmp_path, text: str = SECRET + "\n", mode: int = 0o600):
    path = tmp_path / "announce.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_defaults_off_and_the_file_s_fields(tmp_path):
    config = load_edge_config(None)
    assert config.announce == AnnounceConfig() and not config.announce.enabled
    path = tmp_path / "edge.yml"
    path.write_text("announce:\n  key_file: /etc/eas-edge/announce.key\n  batch_ms: 25\n  edge_name: edge-a\n")
    announce = load_edge_config(path).announce
    assert announce == AnnounceConfig("/etc/eas-edge/announce.key", 25.0, "edge-a") and announce.enabled
    flagged = load_edge_config(path, {"announce.key_file": "/run/other.key"}).announce
    assert flagged.key_file == "/run/other.key" and flagged.batch_ms == 25.0


@pytest.mark.parametrize("text, message", [
    ("announce:\n  batch_ms: 0\n", "announce.batch_ms: must be 1-1000 (milliseconds), got 0"),
    ("announce:\n  batch_ms: 1001\n", "announce.batch_ms: must be 1-1000 (milliseconds), got 1001"),
    ("announce:\n  batch_ms: fast\n", "announce.batch_ms: expected a number, got str 'fast'"),
    ("announce:\n  key_file: ''\n", "announce.key_file: empty path (null turns announcing off)"),
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
    path.write_text("push:\n  enabled: false\nannounce:\n  key_file: /etc/eas-edge/announce.key\n")
    with pytest.raises(ConfigError) as info:
        load_edge_config(path)
    assert str(info.value).startswith(f"{path}: announce.key_file: ") and "push.enabled" in str(info.value)
    with pytest.raises(ConfigError, match=r"<flags>: announce.key_file: announcing needs the push feed "
                                          r"\(push.enabled: true\)"):
        load_edge_config(None, {"announce.key_file": "/x.key", "push.enabled": False})


def test_the_flags_no_push_and_announce_key_file_exit_2_naming_both(capsys, tmp_path):
    path = key_file(tmp_path)
    assert edge_main(["--no-push", "--announce-key-file", str(path), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eas-edge: <flags>: announce.key_file: ") and "push.enabled" in err and "\n" not in err


@pytest.mark.parametrize("text, mode, message", [
    (None, 0o600, "cannot read the announce key token file: No such file or directory"),
    (SECRET, 0o640, "readable by group/others (mode 0640); chmod 600 it (it holds the announce key token)"),
    ("", 0o600, "must hold one announce key token (found nothing)"),
    (f"{SECRET} {SECRET}", 0o600, "must hold one announce key token (found whitespace)"),
    ("bm90IGEga2V5", 0o600, "the edge's private key is 9 bytes, not 32"),
], ids=["missing", "group-readable", "empty", "two-words", "short-key"])  # the key is drawn per run: no key in ids
def test_the_key_file_follows_the_token_file_rules_and_is_an_ed25519_key(tmp_path, capsys, text, mode, message):
    path = tmp_path / "missing.key" if text is None else key_file(tmp_path, text, mode)
    with pytest.raises(ConfigError) as info:
        AnnounceConfig(key_file=str(path)).read_key("edge.yml")
    assert str(info.value) == f"edge.yml: announce.key_file: {path}: {message}" or str(info.value) == (
        f"edge.yml: announce.key_file: {message}")
    assert SECRET not in str(info.value) and "Consul" not in str(info.value)
    # eas-edge reads it at start, before Consul (nothing listens at that Consul address): one line, exit 2
    consul = f"127.0.0.1:{free_port()}"
    assert edge_main(["--announce-key-file", str(path), "--consul", consul, "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eas-edge: <flags>: announce.key_file: ") and err.endswith(message)


def test_a_good_key_file_is_read_and_turns_the_ledger_s_numbering_on(tmp_path):
    path = key_file(tmp_path)
    config = EdgeConfig(announce=AnnounceConfig(key_file=str(path)))
    assert private_text(config.announce.read_key()) == SECRET
    assert Edge(config).state.router.ledger.announcing
    assert not Edge(EdgeConfig()).state.router.ledger.announcing


def test_debug_headers_is_off_unless_the_file_turns_it_on(tmp_path):
    path = tmp_path / "edge.yml"
    assert load_edge_config(None).debug_headers is False
    path.write_text("debug_headers: true\n")
    assert load_edge_config(path).debug_headers is True


def test_rollout_request_key_is_signalled_unless_the_file_says_always_or_never(tmp_path):
    path = tmp_path / "edge.yml"
    assert load_edge_config(None).rollout_request_key == "signalled"
    for value in ("always", "never"):
        path.write_text(f"rollout_request_key: {value}\n")
        assert load_edge_config(path).rollout_request_key == value
    for bad in ("sometimes", "false"):
        path.write_text(f"rollout_request_key: {bad}\n")
        with pytest.raises(ConfigError, match="rollout_request_key"):
            load_edge_config(path)


def test_edge_id_is_the_sanitized_name_the_key_s_id_and_a_new_nonce_each_time(monkeypatch):
    from eas_wire.signing import load_private

    key = load_private(SECRET)
    kid = key_id(key.public_key())
    first, second = edge_id(key, "edge-a"), edge_id(key, "edge-a")
    assert re.fullmatch(rf"edge-a\.{kid}\.[0-9a-f]{{8}}", first) and re.fullmatch(rf"edge-a\.{kid}\.[0-9a-f]{{8}}", second)
    assert first != second
    assert edge_id(key, "edge a/ü:1").startswith("edge-a--:1.")
    assert edge_id(key, "..-edge").startswith("edge.")  # the id must start with a letter or digit
    assert re.fullmatch(rf"edge\.{kid}\.[0-9a-f]{{8}}", edge_id(key, "/// "))
    long = edge_id(key, "x" * 200)
    assert len(long) == 80 and long.startswith("x" * 54 + ".")
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-edge-3.dc1.example")
    assert edge_id(key).startswith("gpu-edge-3.dc1.example.")
    monkeypatch.setattr(announce_module.secrets, "token_hex", lambda n: "0123abcd"[:2 * n])  # 4 bytes: 8 hex
    assert edge_id(key, "e") == f"e.{kid}.0123abcd"
    for name in ("edge-a", "edge a/ü:1", "..-edge", "/// ", "x" * 200, None):
        assert EDGE_ID.fullmatch(edge_id(key, name))


def test_a_misspelt_field_is_named_with_the_field_it_was_meant_to_be(tmp_path):
    path = tmp_path / "edge.yml"
    path.write_text("max_inflight_per_uI: 32\n")
    with pytest.raises(ConfigError, match=r"max_inflight_per_uI: unknown field \(did you mean 'max_inflight_per_iu'\? "
                                          r"known: "):
        load_edge_config(path)
    path.write_text("colour: blue\n")  # nothing close: the known fields only
    with pytest.raises(ConfigError, match=r"colour: unknown field \(known: "):
        load_edge_config(path)


def test_every_eas_edge_option_says_what_it_does(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    lines = capsys.readouterr().out.splitlines()
    options = [k for k, line in enumerate(lines) if re.match(r"^  --[a-z-]+", line)]
    assert len(options) >= 12, lines
    # argparse puts an option's help after two spaces on its line, or on the next line, indented
    silent = [lines[k].split()[0] for k in options if not re.search(r"\S\s{2,}\S", lines[k].strip())
              and not (k + 1 < len(lines) and re.match(r"^ {20,}\S", lines[k + 1]))]
    assert silent == [], lines
