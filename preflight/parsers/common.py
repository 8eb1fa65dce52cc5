"""What every parser shares: the ParseError, text normalisation and small value converters.

Outputs reach the parsers from many places: captured over SSH, pasted from a ticket, collected by
``mpirun --tag-output`` or ``srun --label``, copied from a coloured terminal on Windows. ``lines()`` turns
any of those into the tool's own lines, numbered as in the original text so that a ParseError points a
person at the line they can see in their file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

# CSI sequences (colours, cursor moves) and the two-byte escapes some terminals add.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# OpenMPI --tag-output / --output-filename prefixes: "[1,0]<stdout>:" (jobid,rank).
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr|stddiag)>:")
# srun --label: the task id, right-aligned to the width of the largest one, then ": ".
_SRUN_LABEL = re.compile(r"^ {0,5}\d{1,6}: ")
# The launcher prefix could only be confused with a tool's own text if a tool printed "<digits>: " at the
# very start of a line; none of the parsed tools does (their keys are words, their rows have no colon).

T = TypeVar("T")

# What a person's paste adds to a tool's output (from tickets, runbooks, chat). Each is removed before
# parsing and reported as a warning naming the line ("Pending : Yes   <===" must not read as null).
# Trailing annotations: an arrow ("<===", "<--", "<<", "←") and whatever follows it; a "#" comment after
# two spaces; a parenthesised pointer such as "(this one)". Real values keep their own parentheses
# ("A9FEA97B (169.254.169.123)"): only the pointer words below are taken as an annotation.
_ARROW = re.compile(r"\s*(?:<={2,}|<-{2,}|<<+|←+)(?:\s.*|[^\s<=-].*)?$")
# Two spaces or a tab before the "#": a legend's "a bonded set of # NVLinks" is the tool's own text.
_HASH_COMMENT = re.compile(r"(?<=\S)(?:\s{2,}|\t)#(?:\s.*)?$")
_POINTER = re.compile(
    r"\s+\((?:this one|this|here|bad|broken|wrong|culprit|see (?:above|below)|!+|\?+)\)\s*$", re.IGNORECASE
)
# Elided sections: a line holding only "...", "…", "[snip]", "<snip>", "-- snip --", "[... 40 lines ...]".
_ELISION = re.compile(
    r"^\s*(?:\.{3,}|…+|[\[<(]\s*(?:snip(?:ped)?|cut|\.{3,}|…)[^\]>)]{0,40}[\]>)]|-+\s*snip\s*-+)\s*$", re.IGNORECASE
)
# Shell prompt lines ("$ nvidia-smi -q", "[root@gpu01 ~]# ibstat") are kept: each parser skips what comes
# before its tool's first line, and the nccl parser reads the test name from the command line. Parsers that
# reject every line they cannot read (systemctl-show, mlnx-qos) skip the lines is_prompt() recognises.
# user@host prompts: "[root@gpu01 ~]# ", "ubuntu@gpu01:~$ "
_USER_AT_HOST = r"\[[^\]\s]+@[^\]]+\]\s?[#$]|[\w.-]+@[\w.-]+:\S*\s?[#$]"
_PROMPT = re.compile(rf"^\s*(?:{_USER_AT_HOST}|[#$])\s+\S")
# The prompts no tool output can be: all of the above but a bare "# " (a root prompt, and also the start of
# nccl-tests' own header lines and of comments). These are reported as paste warnings and skipped by the
# parsers that accept nothing but their tool's lines (sysfs, kernel logs, cpulist, cmdline, nvlink).
_SHELL_PROMPT = re.compile(rf"^\s*(?:{_USER_AT_HOST}|\$)\s+\S")
# Spaces a web ticket, wiki or chat turns columns into (no tool prints them): no-break, figure and narrow
# no-break spaces. They are read as spaces, and reported: str.split() would keep them inside a cell.
_WIDE_SPACES = str.maketrans({"\u00a0": " ", "\u2007": " ", "\u202f": " "})


class ParseError(ValueError):
    """Input that is not (or not all of) the expected tool output.

    ``line_no`` is 1-based in the text as given (0 for empty input); ``line`` is that line after
    normalisation. ``str()`` is one line that names both, for the CLI and for check reasons.
    """

    def __init__(self, line_no: int, line: str, message: str):
        self.line_no = line_no
        self.line = line
        self.message = message
        shown = line if len(line) <= 120 else line[:117] + "..."
        super().__init__(f"line {line_no}: {message}: {shown!r}")


@dataclass(frozen=True)
class Line:
    no: int  # 1-based line number in the original text
    text: str  # normalised: no CR, no ANSI, no launcher prefix, no paste annotation, tabs kept

    def __str__(self) -> str:
        return self.text


def _strip_annotation(text: str) -> tuple[str, str]:
    """(text without a trailing hand annotation, the annotation removed or "")."""
    for pattern in (_ARROW, _POINTER, _HASH_COMMENT):
        match = pattern.search(text)
        if match and text[: match.start()].strip():
            return text[: match.start()].rstrip(), text[match.start():].strip()
    return text, ""


def paste_lines(text: str) -> tuple[list[Line], list[str]]:
    """Normalised, numbered lines with what a paste adds removed, and one warning per removal.

    Elision lines are dropped (the others keep their original numbers), non-breaking spaces become spaces,
    trailing annotations are cut off the value they follow, shell prompt lines (:func:`shell_prompt`) are kept (the nccl parser reads its
    test's name there) and reported."""
    text = text.replace("\r\n", "\n")
    kept: list[Line] = []
    warnings: list[str] = []
    spaced_lines: list[int] = []  # lines with non-breaking spaces: one warning for all, where the first is
    spaced_at = 0
    for no, raw in enumerate(text.split("\n"), start=1):
        line = clean_line(raw)
        spaced = line.translate(_WIDE_SPACES)
        if spaced != line:
            if not spaced_lines:
                spaced_at = len(warnings)
                warnings.append("")  # written below, once the lines are counted
            spaced_lines.append(no)
            line = spaced
        if _ELISION.match(line):
            warnings.append(f"line {no}: ignored an elision marker {line.strip()[:40]!r} (lines may be missing there)")
            continue
        if shell_prompt(line):
            warnings.append(f"line {no}: a shell prompt line, not the tool's output: {line.strip()[:60]!r}")
            kept.append(Line(no, line))
            continue
        value, note = _strip_annotation(line)
        if note:
            warnings.append(f"line {no}: ignored the annotation {note[:60]!r} after {value.strip()[-40:]!r}")
        kept.append(Line(no, value))
    if spaced_lines:
        others = len(spaced_lines) - 1
        more = f" (and {others} more line{'s' if others > 1 else ''})" if others else ""
        warnings[spaced_at] = (f"line {spaced_lines[0]}: read non-breaking spaces as spaces{more}: a copy from a "
                               f"web page or chat")
    return kept, warnings


def is_prompt(text: str) -> bool:
    """A shell prompt line with its command: ``$ mlnx_qos -i eth0``, ``[root@gpu01 ~]# systemctl show ..``,
    ``user@host:~$ cat /proc/cmdline``."""
    return bool(_PROMPT.match(text))


def shell_prompt(text: str) -> bool:
    """A prompt line no tool prints: ``$ cat /proc/cmdline``, ``user@host:~$ ...``, ``root@host:~# ...``,
    ``[root@gpu01 ~]# ...`` (not a bare ``# ...``, which a tool's own output can start with)."""
    return bool(_SHELL_PROMPT.match(text))


def clean_line(raw: str) -> str:
    """One physical line without ANSI escapes, stray CRs and launcher prefixes."""
    text = _ANSI.sub("", raw).replace("\r", "")
    text = _MPI_TAG.sub("", text, count=1)
    return _SRUN_LABEL.sub("", text, count=1)


def lines(text: str) -> list[Line]:
    """Normalised, numbered lines of ``text`` (CRLF, lone CR, ANSI colour and launcher prefixes removed,
    and what a paste adds: see :func:`paste_lines`, which also says what was removed)."""
    return paste_lines(text)[0]


def first_nonblank(all_lines: Sequence[Line]) -> Line:
    for line in all_lines:
        if line.text.strip():
            return line
    return Line(0, "")


def last_nonblank(all_lines: Sequence[Line]) -> Line:
    for line in reversed(all_lines):
        if line.text.strip():
            return line
    return Line(0, "")


def only_line(text: str, what: str, example: str) -> Line:
    """The one non-blank line of a one-line file (``/proc/cmdline``, a sysfs list), a pasted prompt line
    before it skipped; ParseError naming the first line when there is none (``no <what> (a line such as
    <example>)``) and the second when there are more."""
    content = [line for line in lines(text) if line.text.strip() and not shell_prompt(line.text)]
    if not content:
        first = first_nonblank(lines(text))
        raise ParseError(first.no, first.text, f"no {what} (a line such as {example!r})")
    if len(content) > 1:
        raise ParseError(content[1].no, content[1].text, f"a {what} is one line")
    return content[0]


def split_runs(all_lines: Sequence[Line], starts_run: Callable[[str], bool]) -> list[list[Line]]:
    """Split a paste holding several outputs of one tool at every line where a new output starts.

    Lines before the first start belong to the first run (a prompt, a command line, log noise)."""
    runs: list[list[Line]] = [[]]
    started = False
    for line in all_lines:
        if starts_run(line.text):
            if started:
                runs.append([])
            started = True
        runs[-1].append(line)
    return runs


def last_complete(runs: Sequence[list[Line]], parse_run: Callable[[list[Line]], T]) -> T:
    """Parse each run from the last backwards and return the first that parses completely.

    When none does, the last run's ParseError is raised: it names the line where the newest output went
    wrong, which is what a person pasting several attempts wants to see."""
    last_error: ParseError | None = None
    for run in reversed(runs):
        try:
            return parse_run(run)
        except ParseError as exc:
            if last_error is None:
                last_error = exc
    assert last_error is not None  # runs is never empty
    raise last_error


def split_key_value(text: str, sep: str = ":") -> tuple[str, str] | None:
    """``"  Rate: 400"`` -> ``("Rate", "400")``; None when the line has no separator."""
    key, found, value = text.partition(sep)
    if not found:
        return None
    return key.strip(), value.strip()


def to_number(token: str, line: Line, what: str) -> int | float:
    """An int when the token is integral as printed, else a float; ParseError naming ``line`` otherwise."""
    token = token.strip()
    try:
        return int(token)
    except ValueError:
        pass
    try:
        value = float(token)
    except ValueError:
        raise ParseError(line.no, line.text, f"{what} is not a number ({token!r})") from None
    if not math.isfinite(value):  # JSON has no inf/nan; a tool printing one is reporting nothing usable
        raise ParseError(line.no, line.text, f"{what} is not a finite number ({token!r})")
    return value


def to_float(token: str, line: Line, what: str) -> float:
    return float(to_number(token, line, what))


def optional(token: str | None) -> str | None:
    """Tokens that mean "no value" (N/A, empty, [N/A]) become None; others are returned trimmed."""
    if token is None:
        return None
    token = token.strip()
    if token in ("", "N/A", "[N/A]", "n/a", "Not Supported", "[Not Supported]"):
        return None
    return token


def yes_no(token: str | None, line: Line | None = None, what: str = "value") -> bool | None:
    """Yes/No (true/false, enabled/disabled); None for N/A or an absent token. Any other word is a
    ParseError naming ``line`` when given (unknown vocabulary is never read as "no value")."""
    value = optional(token)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("yes", "true", "enabled"):
        return True
    if lowered in ("no", "false", "disabled"):
        return False
    if line is not None:
        raise ParseError(line.no, line.text, f"{what} is not Yes or No ({value!r})")
    return None
