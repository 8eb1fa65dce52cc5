"""playbooks/filter_plugins/openpgp.py's ``openpgp_mirror_key``: a site mirror's signing key, given as the armored
block or a keyring file on the controller, is accepted only when it is exactly the pinned key, and comes out as
the armored text gpg itself writes; everything else is one line naming the variable (and both fingerprints when
the key is another). Keys: tests/fixtures/openpgp (made by gpg, fingerprints from gpg's listing)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.unit

KEYS = REPO / "tests/fixtures/openpgp"
MIRROR_FPR = "5B0699B64E745CEDB9005FE0BBC54D2A0998E563"
OTHER_FPR = "92387EC8758AF58673207D9234876D31C63CAD46"
VAR = "nvidia_stack_mirror_key"


def _filters():
    spec = importlib.util.spec_from_file_location("openpgp_filter", REPO / "playbooks/filter_plugins/openpgp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


F = _filters()
MIRROR_ASC = (KEYS / "site-mirror-ed25519.asc").read_text()


@pytest.mark.parametrize("key", [MIRROR_ASC, str(KEYS / "site-mirror-ed25519.asc"), str(KEYS / "site-mirror-ed25519.gpg")],
                         ids=["armored-block", "armored-file", "binary-file"])
def test_the_pinned_key_in_any_form_is_armored_as_gpg_armors_it(key):
    got = F.openpgp_mirror_key(key, "5B06 99B6 4E74 5CED B900  5FE0 BBC5 4D2A 0998 E563", VAR)
    assert got == {"armored": MIRROR_ASC, "fingerprint": MIRROR_FPR, "problem": ""}


def test_no_key_and_no_fingerprint_is_no_mirror_key():
    assert F.openpgp_mirror_key("", "", VAR) == {"armored": "", "fingerprint": "", "problem": ""}
    assert F.openpgp_mirror_key(None, None, VAR)["problem"] == ""


def test_another_key_names_the_variable_and_both_fingerprints():
    got = F.openpgp_mirror_key(str(KEYS / "other-rsa2048.asc"), MIRROR_FPR.lower(), VAR)
    assert got["armored"] == ""
    assert got["problem"] == (f"{VAR} ({KEYS / 'other-rsa2048.asc'} on the controller) is the key {OTHER_FPR}, "
                              f"not {VAR}_fingerprint {MIRROR_FPR}: not installed")


def test_a_block_holding_the_pinned_key_and_another_is_refused():
    both = F.armor(F._dearmor(MIRROR_ASC) + F._dearmor((KEYS / "other-rsa2048.asc").read_text()))
    problem = F.openpgp_mirror_key(both, MIRROR_FPR, VAR)["problem"]
    assert problem == (f"{VAR} (the armored block) holds the keys {MIRROR_FPR}, {OTHER_FPR}, not {VAR}_fingerprint "
                       f"{MIRROR_FPR}: not installed")


@pytest.mark.parametrize(("key", "fingerprint", "problem"), [
    (MIRROR_ASC, "", f"{VAR} is set but {VAR}_fingerprint is empty: set it to the key's fingerprint"),
    ("", MIRROR_FPR, f"{VAR}_fingerprint is {MIRROR_FPR} but {VAR} is empty: set the mirror's key"),
    (MIRROR_ASC, "0998E563", f"{VAR}_fingerprint is '0998E563': a fingerprint is 40 hex digits"),
    (MIRROR_ASC, "BBC54D2A0998E563", f"{VAR}_fingerprint is 'BBC54D2A0998E563': a fingerprint is 40 hex digits"),
    ("keys/mirror.asc", MIRROR_FPR, f"{VAR}: 'keys/mirror.asc' is neither an ASCII-armored public key block nor the "
                                    "absolute path of a keyring file on the controller"),
    ("/nonexistent/mirror.asc", MIRROR_FPR, f"{VAR}: /nonexistent/mirror.asc on the controller cannot be read "
                                            "(No such file or directory)"),
    (str(KEYS / "pubring.kbx"), MIRROR_FPR, f"{VAR}: {KEYS / 'pubring.kbx'} is a GnuPG keybox, which apt cannot read"),
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nxx\n-----END PGP PRIVATE KEY BLOCK-----\n", MIRROR_FPR,
     f"{VAR}: not an ASCII-armored public key block"),
])
def test_what_cannot_be_checked_is_one_line_naming_the_variable(key, fingerprint, problem):
    got = F.openpgp_mirror_key(key, fingerprint, VAR)
    assert got["armored"] == "" and got["problem"].startswith(problem), got["problem"]
    assert "\n" not in got["problem"]


def test_a_secret_key_is_never_installed(tmp_path):
    """A secret-key packet (tag 5, old format: 0x94, one-byte length) before the public key."""
    secret = tmp_path / "mirror-secret.gpg"
    secret.write_bytes(bytes([0x94, 3, 4, 0, 0]) + (KEYS / "site-mirror-ed25519.gpg").read_bytes())
    problem = F.openpgp_mirror_key(str(secret), MIRROR_FPR, VAR)["problem"]
    assert problem.startswith(f"{VAR}: it holds a secret key: give only the public key"), problem


def test_a_truncated_binary_key_is_named(tmp_path):
    cut = tmp_path / "cut.gpg"
    cut.write_bytes((KEYS / "site-mirror-ed25519.gpg").read_bytes()[:40])
    assert F.openpgp_mirror_key(str(cut), MIRROR_FPR, VAR)["problem"] == (
        f"{VAR}: a packet of 51 bytes runs past the end of the key")


def test_fingerprints_keep_their_filter_name_in_errors():
    with pytest.raises(F.KeyFormatError, match="^openpgp_fingerprints: not an ASCII-armored public key block"):
        F.openpgp_fingerprints("<html>404</html>")
