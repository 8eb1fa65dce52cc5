"""A secret's file: read when only its owner can read it; refused, naming the file and the fix, otherwise."""

from __future__ import annotations

import pytest

from eas_wire.private_file import PrivateFileError, read_private_text

pytestmark = pytest.mark.unit


def test_an_owner_only_file_is_read(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(0o600)
    assert read_private_text(path, "the token file") == "s3cret\n"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_a_file_others_can_read_is_refused_with_the_fix_and_never_its_content(tmp_path, mode):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(mode)
    with pytest.raises(PrivateFileError) as caught:
        read_private_text(path, "the token file", "the Consul ACL token")
    assert str(caught.value) == (f"{path}: readable by group/others (mode {mode:04o}); chmod 600 it "
                                 f"(it holds the Consul ACL token)")
    assert "s3cret" not in str(caught.value)


def test_a_missing_or_binary_file_is_one_line_in_the_callers_error_type(tmp_path):
    with pytest.raises(KeyError, match=r"missing: cannot read the keys file: No such file or directory"):
        read_private_text(tmp_path / "missing", "the keys file", error=KeyError)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    binary.chmod(0o600)
    with pytest.raises(PrivateFileError, match=r"binary: not a text file \(the keys file holds a key\)$"):
        read_private_text(binary, "the keys file", "a key")
