"""The one-word parsers (pm-qos, date-epoch, ecn-switch, systemctl-is-active, dpkg-version): the rules their
docstring states (goldens hold every fixture's whole JSON)."""

from __future__ import annotations

import pytest

from preflight.parsers import ParseError, parse
from preflight.parsers import single_value as words


def test_pm_qos_reads_ods_right_aligned_number_and_nothing_wider_than_32_bits():
    assert words.parse_pm_qos(" 2000000000\n").latency_us == 2000000000
    assert words.parse_pm_qos("          0").latency_us == 0
    with pytest.raises(ParseError, match="out of range"):
        words.parse_pm_qos(" 4294967296\n")


@pytest.mark.parametrize("kind", ["pm-qos", "date-epoch"])
@pytest.mark.parametrize("text", ["\u00b2\n", "\u0661\u0667\u0666\n", "-1\n", "12 34\n", "1.5\n", "0x10\n", "%s\n"])
def test_numbers_are_ascii_digits_only(kind, text):
    """str.isdigit() is true for '²' and for other scripts' digits; neither od nor date prints them."""
    with pytest.raises(ParseError, match="ASCII digits only"):
        parse(kind, text)


def test_a_second_line_is_an_error_naming_it():
    with pytest.raises(ParseError) as caught:
        words.parse_epoch("1764547200\n1764547201\n")
    assert caught.value.line_no == 2 and "one line" in caught.value.message


def test_ecn_switch_is_0_or_1():
    assert (words.parse_ecn_switch("1\n").enabled, words.parse_ecn_switch("0\n").enabled) == (True, False)
    for text in ("2\n", "01\n", "true\n", "1 0\n"):
        with pytest.raises(ParseError, match="0 or 1"):
            words.parse_ecn_switch(text)


def test_is_active_keeps_one_state_per_unit_in_order_and_rejects_other_words():
    assert words.parse_is_active("active\ninactive\nfailed\n").states == ("active", "inactive", "failed")
    with pytest.raises(ParseError) as caught:
        words.parse_is_active("active\nFailed to connect to bus: No such file or directory\n")
    assert caught.value.line_no == 2 and "not a unit state" in caught.value.message


@pytest.mark.parametrize(("text", "epoch", "upstream", "revision"), [
    ("2.21.5-1+cuda12.4", None, "2.21.5", "1+cuda12.4"),
    ("1:2.18.5-1ubuntu1", 1, "2.18.5", "1ubuntu1"),
    ("2.0-rc1-3", None, "2.0-rc1", "3"),  # the revision follows the last hyphen
    ("2.21.5", None, "2.21.5", None),
])
def test_dpkg_version_splits_epoch_upstream_and_revision(text, epoch, upstream, revision):
    parsed = words.parse_dpkg_version(text)
    assert (parsed.version, parsed.epoch, parsed.upstream, parsed.revision) == (text, epoch, upstream, revision)


def test_dpkg_version_names_the_package_of_plain_dpkg_query_w():
    parsed = words.parse_dpkg_version("libnccl2\t2.21.5-1+cuda12.4\n")
    assert (parsed.package, parsed.version) == ("libnccl2", "2.21.5-1+cuda12.4")


@pytest.mark.parametrize("text", ["cuda12.4", "2.21-", "1:", "2.21.5 1", "2.21_5-1", "Libnccl2\t2.21.5"])
def test_dpkg_version_rejects_what_policy_does_not_allow(text):
    with pytest.raises(ParseError):
        words.parse_dpkg_version(text)
