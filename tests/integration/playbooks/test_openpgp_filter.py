"""playbooks/filter_plugins/openpgp.py: the fingerprints it computes are gpg's, for the key types apt
repositories use (RSA, as HashiCorp's; ed25519, as the stand-in repository's), one key or several; anything
that is not an armored public key is an error naming what it got, never an empty list."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("openpgp_filter", REPO / "playbooks/filter_plugins/openpgp.py")
openpgp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(openpgp)


def gpg(home: Path, *args: str) -> str:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--quiet", *args], check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def keyring(tmp_path_factory):
    home = Path(subprocess.run(["mktemp", "-d", "/tmp/clusterctl-gpg-test.XXXXXX"], check=True, capture_output=True,
                               text=True).stdout.strip())  # short: gpg-agent's socket path has 107 bytes at most
    try:
        for uid, algo in (("rsa test <rsa@example.invalid>", "rsa2048"), ("ed test <ed@example.invalid>", "ed25519")):
            gpg(home, "--passphrase", "", "--pinentry-mode", "loopback", "--quick-gen-key", uid, algo, "sign", "never")
        fingerprints = {line.split(":")[9] for line in gpg(home, "--with-colons", "--list-keys").splitlines()
                        if line.startswith("fpr:")}
        keys = {uid.split()[0]: gpg(home, "--armor", "--export", uid.split()[0]) for uid in ("rsa", "ed")}
        yield keys, fingerprints, gpg(home, "--armor", "--export")
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True)
        subprocess.run(["rm", "-rf", str(home)], check=True)


def test_fingerprints_are_gpg_s(keyring):
    keys, fingerprints, both = keyring
    got = {name: openpgp.openpgp_fingerprints(text) for name, text in keys.items()}
    assert all(len(v) == 1 for v in got.values()) and {v[0] for v in got.values()} == fingerprints
    assert sorted(openpgp.openpgp_fingerprints(both)) == sorted(fingerprints)  # a block of two keys


def test_gpg_s_spaced_form_compares_equal():
    assert openpgp.normalized_fingerprint("798A EC65 4E5C 1542 8C8E  42EE AA16 FCBC A621 E701") == (
        "798AEC654E5C15428C8E42EEAA16FCBCA621E701")


@pytest.mark.parametrize(("text", "words"), [
    ("<html><body>404 Not Found</body></html>", "not an ASCII-armored public key block"),
    ("", "not an ASCII-armored public key block"),
    ("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n!!!not base64!!!\n-----END PGP PUBLIC KEY BLOCK-----\n", "not base64"),
    ("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nAAAA\n-----END PGP PUBLIC KEY BLOCK-----\n", "not a packet header"),
])
def test_what_is_not_a_key_is_an_error_naming_it(text, words):
    with pytest.raises(openpgp.KeyFormatError, match=words):
        openpgp.openpgp_fingerprints(text)


def test_a_truncated_key_is_an_error(keyring):
    keys, _, _ = keyring
    import base64

    data = openpgp._dearmor(keys["rsa"])[:40]
    text = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n" + base64.b64encode(data).decode() + "\n-----END PGP PUBLIC KEY BLOCK-----\n"
    with pytest.raises(openpgp.KeyFormatError, match="runs past the end"):
        openpgp.openpgp_fingerprints(text)
