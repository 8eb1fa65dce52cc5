"""Regular expressions for ``?filter=... matches``, searched in time linear in the text, as RE2 searches.

Consul evaluates ``matches`` with Go's ``regexp`` package (RE2 syntax: no backreferences, no lookaround),
which simulates the pattern's automaton and so takes time proportional to text length x pattern size for
every pattern (https://developer.hashicorp.com/consul/api-docs/features/filtering, https://pkg.go.dev/regexp).
Python's ``re`` backtracks: ``^(.*)*z$`` takes seconds on a 28-character service ID, and holds the GIL
while it does, so neither a lock released early nor a timeout thread would keep the server answering.
So the dev server does what Go does: the pattern is read by Python's own regex parser (``re._parser``,
ASCII mode) and compiled to a Thompson NFA that :meth:`Pattern.search` simulates with a lazily built,
size-capped DFA cache. Python's ``re`` never runs a client's pattern.

Refused with :class:`RegexError` (the filter answers 400), as RE2 refuses them: backreferences,
lookahead/lookbehind, conditionals, atomic groups and possessive quantifiers, ``(?x)``, ``\\Z`` (write
``\\z``), a repeat count over 1000. Refused because this reader does not have them (RE2 does): POSIX
classes such as ``[[:alpha:]]``, ``\\pL``, ``\\Q..\\E``, ``(?U)``, and Go's mid-pattern ``a(?i)b``. Refused
as the dev server's own bound: a pattern of more than :data:`MAX_STATES` automaton states ("expression
too large", as Go says of larger ones). Semantics follow Go where Python's differ: ``$`` without ``(?m)``
is the end of the text only, ``\\d \\w \\s \\b`` are ASCII (``\\s`` without ``\\v``), ``.`` is any
character but newline.
"""

from __future__ import annotations

import re
import warnings
from re import _constants as sre
from re import _parser

MAX_REPEAT = 1000  # Go's regexp/syntax limit on {n,m}
MAX_STATES = 1000  # automaton states; worst case per value is len(text) x this many steps (~0.5 s for 4 KiB)
_CACHE_LIMIT = 4096  # cached DFA transitions per pattern; cleared when full (RE2 does the same)

_WORD = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_CATEGORIES = {
    sre.CATEGORY_DIGIT: (frozenset("0123456789"), False),
    sre.CATEGORY_NOT_DIGIT: (frozenset("0123456789"), True),
    sre.CATEGORY_SPACE: (frozenset("\t\n\f\r "), False),
    sre.CATEGORY_NOT_SPACE: (frozenset("\t\n\f\r "), True),
    sre.CATEGORY_WORD: (_WORD, False),
    sre.CATEGORY_NOT_WORD: (_WORD, True),
}
_UNESCAPED = r"(?<!\\)(?:\\\\)*"  # an even run of backslashes before what follows: it is not escaped


class RegexError(ValueError):
    """The pattern is refused (RE2 would refuse it, or it is past the dev server's bound)."""


class _Char:
    __slots__ = ("test", "out")

    def __init__(self, test, out):
        self.test, self.out = test, out


class _Split:
    __slots__ = ("outs",)

    def __init__(self, outs):
        self.outs = outs


class _Assert:
    __slots__ = ("kind", "out")

    def __init__(self, kind, out):
        self.kind, self.out = kind, out


_MATCH = object()


def compile_pattern(pattern: str) -> Pattern:
    if re.search(_UNESCAPED + r"\\Z", pattern):
        raise RegexError("invalid escape sequence: `\\Z` (RE2 has \\z)")
    if re.search(r"\[:\^?[a-z]+:\]", pattern):
        raise RegexError("POSIX character classes ([[:alpha:]]) are not supported by the dev server")
    python_form = re.sub(_UNESCAPED + r"\\z", lambda m: m.group(0)[:-1] + "Z", pattern)  # Go's \z is Python's \Z
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FutureWarning on nested sets: refused above or parsed as text
            parsed = _parser.parse(python_form, re.ASCII)
    except re.error as exc:
        raise RegexError(str(exc)) from None
    except RecursionError:
        raise RegexError("expression nests too deeply") from None
    if parsed.state.flags & re.VERBOSE:
        raise RegexError("invalid or unsupported Perl syntax: `(?x`")
    builder = _Builder()
    try:
        start = builder.sequence(list(parsed), parsed.state.flags, _MATCH)
    except RecursionError:
        raise RegexError("expression nests too deeply") from None
    return Pattern(pattern, start)


class _Builder:
    """Compiles the parse tree backwards: each piece is built with the state that follows it."""

    def __init__(self):
        self.count = 0

    def new(self, state):
        self.count += 1
        if self.count > MAX_STATES:
            raise RegexError(f"expression too large (more than {MAX_STATES} automaton states)")
        return state

    def sequence(self, items, flags, out):
        for op, av in reversed(items):
            out = self.item(op, av, flags, out)
        return out

    def item(self, op, av, flags, out):
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN):
            return self.new(_Char(_char_test(op, av, flags), out))
        if op is sre.SUBPATTERN:
            _group, add, remove, items = av
            return self.sequence(items, (flags | add) & ~remove, out)
        if op is sre.BRANCH:
            return self.new(_Split([self.sequence(items, flags, out) for items in av[1]]))
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):  # greedy or lazy: the same set of matches
            low, high, items = av
            unbounded = high >= sre.MAXREPEAT
            if low > MAX_REPEAT or (not unbounded and high > MAX_REPEAT):
                raise RegexError(f"invalid repeat count (over {MAX_REPEAT})")
            if unbounded:
                loop = self.new(_Split([]))
                loop.outs = [self.sequence(items, flags, loop), out]
                tail = loop
            else:
                tail = out
                for _ in range(high - low):
                    tail = self.new(_Split([self.sequence(items, flags, tail), out]))
            for _ in range(low):
                tail = self.sequence(items, flags, tail)
            return tail
        if op is sre.AT:
            return self.new(_Assert(_anchor(av, flags), out))
        raise RegexError(_UNSUPPORTED.get(op, f"invalid or unsupported Perl syntax ({op})"))


_UNSUPPORTED = {
    sre.GROUPREF: "invalid escape sequence: backreferences are not supported (RE2 has none)",
    sre.GROUPREF_EXISTS: "invalid or unsupported Perl syntax: `(?(` (conditionals)",
    sre.ASSERT: "invalid or unsupported Perl syntax: lookahead/lookbehind `(?=`, `(?<=` (RE2 has none)",
    sre.ASSERT_NOT: "invalid or unsupported Perl syntax: lookahead/lookbehind `(?!`, `(?<!` (RE2 has none)",
    sre.ATOMIC_GROUP: "invalid or unsupported Perl syntax: `(?>` (atomic groups)",
    sre.POSSESSIVE_REPEAT: "invalid nested repetition operator: possessive `*+`, `++`, `?+`",
}


def _anchor(at, flags) -> str:
    multiline = bool(flags & re.MULTILINE)
    if at is sre.AT_BEGINNING:
        return "line_start" if multiline else "text_start"
    if at is sre.AT_END:
        return "line_end" if multiline else "text_end"
    return {sre.AT_BEGINNING_STRING: "text_start", sre.AT_END_STRING: "text_end",
            sre.AT_BOUNDARY: "boundary", sre.AT_NON_BOUNDARY: "not_boundary"}[at]


def _char_test(op, av, flags):
    fold = bool(flags & re.IGNORECASE)

    def variants(ch: str):
        return (ch, ch.lower(), ch.upper()) if fold else (ch,)

    if op is sre.ANY:
        return (lambda ch: True) if flags & re.DOTALL else (lambda ch: ch != "\n")
    if op is sre.LITERAL:
        wanted = frozenset(variants(chr(av)))
        return wanted.__contains__
    if op is sre.NOT_LITERAL:
        unwanted = frozenset(variants(chr(av)))
        return lambda ch: ch not in unwanted
    negate, singles, ranges, categories = False, set(), [], []
    for item_op, item_av in av:
        if item_op is sre.NEGATE:
            negate = True
        elif item_op is sre.LITERAL:
            singles.add(chr(item_av))
        elif item_op is sre.RANGE:
            ranges.append(item_av)
        elif item_op is sre.CATEGORY:
            categories.append(_CATEGORIES[item_av])
        else:
            raise RegexError(f"invalid character class item ({item_op})")

    def member(ch: str) -> bool:
        for c in variants(ch):
            if c in singles or any(lo <= ord(c) <= hi for lo, hi in ranges):
                return True
            if any((c in chars) != inverted for chars, inverted in categories):
                return True
        return False

    return (lambda ch: not member(ch)) if negate else member


def _kind(ch: str | None) -> int:
    """What an anchor needs to know of a neighbouring character: 0 none (edge), 1 newline, 2 word, 3 other."""
    if ch is None:
        return 0
    if ch == "\n":
        return 1
    return 2 if ch in _WORD else 3


def _holds(kind: str, before: int, after: int) -> bool:
    if kind == "text_start":
        return before == 0
    if kind == "text_end":
        return after == 0
    if kind == "line_start":
        return before in (0, 1)
    if kind == "line_end":
        return after in (0, 1)
    boundary = (before == 2) != (after == 2)
    return boundary if kind == "boundary" else not boundary


class Pattern:
    """A compiled pattern; :meth:`search` is ``re.search(...) is not None`` in linear time."""

    def __init__(self, text: str, start):
        self.text, self.start = text, start
        self._closures: dict = {}
        self._steps: dict = {}

    def search(self, text: str) -> bool:
        current: tuple = ()
        last = len(text)
        for i in range(last + 1):
            context = (_kind(text[i - 1] if i else None), _kind(text[i] if i < last else None))
            chars, matched = self._closure(current, context)
            if matched:
                return True
            if i == last:
                return False
            current = self._step(chars, text[i])
        return False

    def _closure(self, current: tuple, context: tuple[int, int]):
        """The character states reachable from ``current`` plus the start (an unanchored search) through
        splits and the anchors that hold at this position; and whether the match state is among them."""
        key = (current, context)
        hit = self._closures.get(key)
        if hit is not None:
            return hit
        seen, chars, matched = set(), [], False
        stack = [self.start, *reversed(current)]
        while stack:
            state = stack.pop()
            if id(state) in seen:
                continue
            seen.add(id(state))
            if state is _MATCH:
                matched = True
            elif isinstance(state, _Char):
                chars.append(state)
            elif isinstance(state, _Split):
                stack.extend(reversed(state.outs))
            elif _holds(state.kind, *context):
                stack.append(state.out)
        hit = (tuple(chars), matched)
        self._remember(self._closures, key, hit)
        return hit

    def _step(self, chars: tuple, ch: str) -> tuple:
        key = (chars, ch)
        hit = self._steps.get(key)
        if hit is None:
            hit = tuple(state.out for state in chars if state.test(ch))
            self._remember(self._steps, key, hit)
        return hit

    @staticmethod
    def _remember(cache: dict, key, value) -> None:
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[key] = value
