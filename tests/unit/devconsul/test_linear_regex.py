"""``devconsul.linear_regex``: RE2's answers (Go's regexp, which Consul's ``matches`` uses) in linear time.

Where Go and Python agree (texts without a newline, ASCII classes), the answer is Python's ``re.search``
on the same pattern; where they differ, Go's (https://pkg.go.dev/regexp/syntax)."""

from __future__ import annotations

import random
import re
import time

import pytest

from devconsul.linear_regex import MAX_STATES, RegexError, compile_pattern

pytestmark = pytest.mark.unit

AGREED = [r"-[ab]$", r"(?i)A[^b-d\dX]\b", r"a{2,5}?x+?(?:ab|c)", r"^a|b$", r"\bfoo\B", r"[a-c]+d", r"x?", r"",
          r"^$", r"a.c", r"(a|ab)(c|bcd)", r"[\w-]+@\d{2,3}", r"(?i)[a-z]{3}", r"^\s*$", r"(a*)*b", r"(?:a|b)*abb",
          r"\W+", r"[^\s]", r"(?i:ab)c", r"[^a]", r"a{0}b", r"(a|)+c"]


@pytest.mark.parametrize("pattern", AGREED)
def test_agrees_with_python_where_go_does(pattern):
    rng = random.Random(pattern)
    ours, theirs = compile_pattern(pattern), re.compile(pattern, re.ASCII)
    for _ in range(300):
        text = "".join(rng.choice("abcxdzfo-_AB 1@") for _ in range(rng.randint(0, 12)))
        assert ours.search(text) == (theirs.search(text) is not None), (pattern, text)


@pytest.mark.parametrize("pattern, text, want", [
    ("a$", "a\n", False),  # Go: $ is the end of the text; Python's also matches before a final newline
    ("(?m)a$", "a\nb", True),
    (r"a\z", "a", True),
    (r"\s", "\v", False),  # Go's \s is [\t\n\f\r ]
    (r"\d", "\u0663", False),  # ASCII digits only
    (".", "\n", False),
    ("(?s).", "\n", True),
    (r"\\z", "\\z", True),  # an escaped backslash, then a literal z
])
def test_go_semantics(pattern, text, want):
    assert compile_pattern(pattern).search(text) is want


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=a)", "(?!a)", "(?<=a)b", "(?<!a)b", "(?P<n>a)(?P=n)",
                                     "(?>a)", "a*+", "(a)?(?(1)b)", "a{1001}", "(?x)a", "[[:alpha:]]", r"a\Z",
                                     r"\pL", "(", "(.{40}){40}"])
def test_refused(pattern):
    with pytest.raises(RegexError):
        compile_pattern(pattern)


@pytest.mark.parametrize("pattern", [r"^(.*)*z$", r"^(a+)+$", r"^(a|a)*$", r"(\w|\d)*z", r".*.*.*.*.*.*.*.*z"])
def test_catastrophic_backtracking_patterns_take_linear_time(pattern):
    """Each takes Python's ``re`` years on this text (exponential or high-degree polynomial)."""
    compiled = compile_pattern(pattern)
    started = time.monotonic()
    assert compiled.search("a" * 4000 + "!") is False
    assert time.monotonic() - started < 1.0


def test_worst_case_is_bounded_by_the_state_cap():
    compiled = compile_pattern("a" * (MAX_STATES - 2) + "b")
    started = time.monotonic()
    assert compiled.search("a" * 4096) is False
    assert time.monotonic() - started < 5.0
