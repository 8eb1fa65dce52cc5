"""Client keys (edge.auth) and the access fields of the edge's config (edge.access_config)."""

from __future__ import annotations

import hashlib
import logging

import pytest

from edge import auth
from edge.access_config import AccessConfig
from edge.auth import KeysFileError, bearer_key, hash_key, new_key, read_keys_file
from edge.config import ConfigError, load_edge_config
from edge.main import main as edge_main

pytestmark = pytest.mark.unit


def write(tmp_path, name: str, text: str, mode: int = 0o600):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return path


def test_keys_are_stored_as_sha256_and_matched_per_tenant(tmp_path):
    a, b = new_key(), new_key()
    assert len(a) >= 43 + 7 and a != b  # 256 random bits, URL-safe base64
    assert hash_key(a) == "sha256:" + hashlib.sha256(a.encode()).hexdigest()
    table = read_keys_file(write(tmp_path, "keys", f"# comment\nteam-a {hash_key(a)}\n\nteam-b {hash_key(b)}  # b\n"))
    assert (table.tenant_of(a), table.tenant_of(b), table.tenant_of(a + "x"), table.tenant_of("")) == (
        "team-a", "team-b", None, None)
    assert table.tenants == {"team-a", "team-b"}


@pytest.mark.parametrize(("text", "mode", "message"), [
    ("team-a sha256:" + "0" * 64 + "\n", 0o640, "readable by group/others (mode 0640)"),
    ("team-a sk-eas-plaintext\n", 0o600, ":1: expected '<tenant> sha256:<64 hex digits>'"),
    ("ok sha256:" + "0" * 64 + "\nbad tenant sha256:" + "0" * 64 + "\n", 0o600, ":2: expected"),
    ("# nothing\n", 0o600, "no keys"),
])
def test_an_unusable_keys_file_is_refused_without_echoing_it(tmp_path, text, mode, message):
    with pytest.raises(KeysFileError) as info:
        read_keys_file(write(tmp_path, "keys", text, mode))
    assert message in str(info.value) and "plaintext" not in str(info.value)


def test_bearer_header_reading():
    assert bearer_key("Bearer abc") == ("abc", None)
    assert bearer_key("bearer  abc ") == ("abc", None)
    assert bearer_key(None) == (None, "missing")
    assert bearer_key("  ") == (None, "missing")
    for header in ("Basic abc", "Bearer", "Bearer a b", "abc"):
        assert bearer_key(header) == (None, "malformed")


def test_the_key_generator_prints_a_key_and_its_line(capsys):
    assert auth.main(["new", "team-a"]) == 0
    out = capsys.readouterr().out.splitlines()
    key = out[0].rsplit(" ", 1)[1]
    assert out[1] == f"keys file line: team-a {hash_key(key)}"
    assert auth.main(["new", "bad tenant"]) == 2


def test_a_client_address_others_can_reach_needs_keys_or_auth_none_spelled_out(tmp_path):
    path = tmp_path / "edge.yml"
    for listen in ("edge-1.cluster.invalid:8080", "edge-2.cluster.invalid:443"):
        path.write_text(f"listen: '{listen}'\n")
        with pytest.raises(ConfigError) as info:
            load_edge_config(path)
        assert "auth: " in str(info.value) and "keys_file" in str(info.value)
        path.write_text(f"listen: '{listen}'\nauth: none\n")
        assert load_edge_config(path).access.auth_none
        path.write_text(f"listen: '{listen}'\nauth:\n  keys_file: /etc/eas-edge/api-keys\n")
        assert load_edge_config(path).access.keys_file == "/etc/eas-edge/api-keys"
    for listen in ("127.0.0.1:8080", "[::1]:8080", "localhost:8080"):  # loopback: a local gateway in front
        path.write_text(f"listen: '{listen}'\n")
        assert not load_edge_config(path).access.auth_decided


@pytest.mark.parametrize(("text", "message"), [
    ("auth: off\n", "auth: expected 'none' or a mapping with keys_file"),
    ("auth: {}\n", "auth.keys_file: expected the path"),
    ("auth: {keys_file: /k, extra: 1}\n", "auth.extra: unknown field"),
    ("tls: {cert_file: /c}\n", "tls.key_file: tls needs both"),
    ("tls: yes\n", "tls: expected a mapping"),
    ("upstream_api_key_file: ''\n", "upstream_api_key_file: empty path"),
    ("admin_listen: nowhere\n", "admin_listen: expected HOST:PORT"),
])
def test_access_field_errors_are_one_line(tmp_path, text, message):
    path = write(tmp_path, "edge.yml", text, 0o644)
    with pytest.raises(ConfigError) as info:
        load_edge_config(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_defaults_and_fields(tmp_path):
    assert load_edge_config(None).access == AccessConfig(admin_listen="127.0.0.1:9180")
    path = write(tmp_path, "edge.yml", "admin_listen: 127.0.0.1:9999\nupstream_api_key_file: /etc/k\n"
                 "tls: {cert_file: /c.pem, key_file: /k.pem}\n", 0o644)
    access = load_edge_config(path).access
    assert (access.admin_listen, access.upstream_api_key_file, access.tls_cert_file, access.tls_key_file) == (
        "127.0.0.1:9999", "/etc/k", "/c.pem", "/k.pem") and access.tls


def test_unusable_secrets_stop_the_edge_at_start_with_one_line_and_no_secret(tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    keys = write(tmp_path, "keys", "t sha256:" + "0" * 64 + "\n", 0o644)
    upstream = write(tmp_path, "iu-key", "unit-secret-key\n", 0o644)
    tls_key = write(tmp_path, "edge.key", "-----BEGIN PRIVATE KEY-----\n", 0o644)
    for field, text in (("auth.keys_file", f"auth: {{keys_file: {keys}}}\n"),
                        ("upstream_api_key_file", f"upstream_api_key_file: {upstream}\n"),
                        ("tls.key_file", f"tls: {{cert_file: {tmp_path}/c.pem, key_file: {tls_key}}}\n")):
        config = write(tmp_path, "edge.yml", "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n"
                       "consul: {address: '127.0.0.1:1'}\n" + text, 0o644)
        assert edge_main(["--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert f"{field}: " in err and "readable by group/others" in err and len(err.splitlines()) == 1
        assert "unit-secret-key" not in err + caplog.text
