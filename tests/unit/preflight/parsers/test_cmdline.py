"""The kernel command line parser (preflight/parsers/cmdline.py): hyphenated names, the last value wins,
init arguments, strict on anything else."""

from __future__ import annotations

import pytest

from preflight.parsers import ParseError, cmdline
from tests.helpers.preflight import fixture_text

pytestmark = pytest.mark.unit


def test_cmdline_names_with_hyphens_last_value_wins_and_init_args():
    args = cmdline.parse(fixture_text("cmdline", "hyphenated-name-given-twice.txt"))
    assert args.value("intel_idle.max_cstate") == "1" and args.value("processor.max-cstate") == "1"
    quoted = cmdline.parse(fixture_text("cmdline", "quoted-value-and-init-args.txt"))
    assert quoted.params == {"root": "/dev/sda1", "dyndbg": "file drivers/usb/* +p"}
    assert quoted.flags == ["ro"] and quoted.args[-2:] == ["--", "single"]


@pytest.mark.parametrize("bad", ["ro quiet\n", 'root=/dev/sda ro x="y\n', "root=/ ro\nsecond line\n",
                                 "root=/dev/sda\x07 ro\n"])
def test_cmdline_is_strict(bad):
    with pytest.raises(ParseError):
        cmdline.parse(bad)
