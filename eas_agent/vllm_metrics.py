"""Parse a vLLM Prometheus ``/metrics`` scrape into the few numbers the agent scores on.

Pure: text -> :class:`VllmMetrics`. Both engine generations are read:

- V1 (vLLM >= 0.8, ``vllm/v1/metrics/loggers.py``): ``vllm:kv_cache_usage_perc`` (0.10+; earlier V1 and
  the deprecated alias print ``vllm:gpu_cache_usage_perc``), ``vllm:prefix_cache_queries_total`` /
  ``vllm:prefix_cache_hits_total``; labels ``model_name`` and ``engine`` (a series per data-parallel engine).
- V0 (``vllm/engine/metrics.py``): ``vllm:gpu_cache_usage_perc``, ``vllm:num_requests_swapped``,
  ``vllm:gpu_prefix_cache_hit_rate``; label ``model_name``.

Shared: ``vllm:num_requests_running``/``waiting`` (gauges), ``vllm:num_preemptions_total``,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total`` (counters),
``vllm:request_prompt_tokens`` (histogram). Running, waiting and counters are summed over engines and
models, KV usage is the max (the fullest engine is the one that blocks), as the parse-json contract says.

Only the families the agent reads are parsed: the sample lines named in :data:`WANTED_SAMPLES` and the
``# HELP``/``# TYPE`` lines of :data:`WANTED`. One regular expression finds them in the text (:data:`_READ_LINE`),
so the rest of a scrape (histogram buckets, ``_created`` samples, python_gc_*, process_*, http_*: most of its
text) costs no Python work per line; the agent parses every IU's scrape every cycle. The rules:

- a line whose metric name is one read (after any leading blanks) must be a well-formed sample line, else the
  scrape is refused naming that line (so is a bad value, a non-finite or negative one, a truncated scrape);
  except in the families the score does not use (:data:`UNSCORED`): a bad value there is left out (the field
  is None) with a ``warnings`` entry naming the sample, and the scrape is read;
- V0's ``vllm:gpu_prefix_cache_hit_rate`` is ``-1`` when prefix caching is off (V0's default; its own log
  line prints the rate only when it is ``>= 0``, ``vllm/engine/metrics.py``): that sentinel is None, no error;
- a line of any other family is not looked at: nothing is scored from it, and one odd line there (a newer
  exporter's syntax, such as Prometheus 3's quoted names, or corruption) must not blind the IU's score. A name
  cut short (``vllm:num_requests_runn``) is another family's name;
- a scrape without any sample line of a family read is checked line by line (:func:`_parse_checked_whole`):
  an HTML error page is refused naming its first line, and other exporters' well-formed text reads as unknowns.

The samples read are parsed here when they have the common shape of vLLM's exposition, else by
prometheus_client's parser (see :func:`_fast_samples`). Example::

    >>> m = parse_vllm_metrics(open("tests/fixtures/vllm/v1_single_engine.txt").read())
    >>> m.schema, m.num_requests_running, m.kv_cache_usage
    ('v1', 237.0, 0.802489)
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass

from prometheus_client.parser import text_string_to_metric_families

# sample name -> field; counters appear with their _total sample name.
GAUGES = {
    "vllm:num_requests_running": "num_requests_running",
    "vllm:num_requests_waiting": "num_requests_waiting",
    "vllm:num_requests_swapped": "num_requests_swapped",
}
COUNTERS = {
    "vllm:num_preemptions_total": "num_preemptions_total",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:request_success_total": "request_success_total",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits_total",
}
KV_V1 = "vllm:kv_cache_usage_perc"
KV_V0 = "vllm:gpu_cache_usage_perc"
PREFIX_HIT_RATE_V0 = "vllm:gpu_prefix_cache_hit_rate"
PROMPT_HISTOGRAM = "vllm:request_prompt_tokens"
GENERATION_HISTOGRAM = "vllm:request_generation_tokens"
# Samples read and reported but not scored (eas_agent.score and the collector read none of them): a bad value in
# one of them must not make the IU's score unknown.
UNSCORED = frozenset(["vllm:num_requests_swapped", "vllm:prefix_cache_hits_total", PREFIX_HIT_RATE_V0])
# V0 exports the hit-rate gauge as -1 when prefix caching is off (and -1 is what its allocators return then).
PREFIX_CACHING_OFF = -1.0

WANTED = frozenset(
    [
        *GAUGES,
        *COUNTERS,
        *(c.removesuffix("_total") for c in COUNTERS),
        KV_V1,
        KV_V0,
        PREFIX_HIT_RATE_V0,
        PROMPT_HISTOGRAM,
        GENERATION_HISTOGRAM,
    ]
)
# Only these samples are parsed: histogram buckets and _created samples are most of a scrape's text and the
# score needs none of them (parsing labels is the expensive part).
WANTED_SAMPLES = frozenset(
    [
        *GAUGES,
        *COUNTERS,
        KV_V1,
        KV_V0,
        PREFIX_HIT_RATE_V0,
        *(h + suffix for h in (PROMPT_HISTOGRAM, GENERATION_HISTOGRAM) for suffix in ("_sum", "_count")),
    ]
)
_METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# group 1: the sample's name (it ends where its labels or the value's blank begin)
_SAMPLE_LINE = re.compile(rf"^({_METRIC_NAME})(\{{.*\}})?[ \t]+[^ \t]+([ \t]+-?[0-9]+)?[ \t]*$")


class MetricsParseError(ValueError):
    """Unparseable scrape: names the line (1-based) and shows it."""

    def __init__(self, line_no: int | None, line: str, reason: str):
        where = f"line {line_no}: " if line_no is not None else ""
        shown = f": {line[:120]!r}" if line else ""
        super().__init__(f"{where}{reason}{shown}")
        self.line_no = line_no


@dataclass(frozen=True)
class VllmMetrics:
    schema: str | None  # "v1" | "v0" | None (neither KV gauge present)
    num_requests_running: float | None
    num_requests_waiting: float | None
    kv_cache_usage: float | None  # 0..1, max over engines
    num_requests_swapped: float | None = None  # V0 only
    num_preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    request_success_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_hit_rate: float | None = None  # V0 gauge
    prompt_tokens_sum: float | None = None  # vllm:request_prompt_tokens histogram _sum / _count
    prompt_tokens_count: float | None = None
    generation_tokens_sum: float | None = None
    generation_tokens_count: float | None = None
    engines: int = 0
    warnings: tuple[str, ...] = ()  # samples of UNSCORED families left out for a bad value

    def contract_json(self) -> dict:
        """Exactly the keys of the parse-json contract's "vLLM metrics" section."""
        return {
            "schema": self.schema,
            "num_requests_running": self.num_requests_running,
            "num_requests_waiting": self.num_requests_waiting,
            "kv_cache_usage": self.kv_cache_usage,
        }

    def to_json(self) -> dict:
        """Every field read (``warnings`` apart: the contract carries them at its top level)."""
        data = asdict(self)
        del data["warnings"]
        return data


def _wanted_family(name: str) -> bool:
    return name in WANTED


def split_scrapes(lines: list[str]) -> list[tuple[int, list[str]]]:
    """Split a file holding several scrapes (one ``curl`` appended after another) at a repeated ``# HELP``."""
    scrapes: list[tuple[int, list[str]]] = [(0, [])]
    seen: set[str] = set()
    for i, line in enumerate(lines):
        if line.startswith("# HELP "):
            name = line[7:].split(" ", 1)[0]
            if name in seen:
                scrapes.append((i, []))
                seen = set()
            seen.add(name)
        scrapes[-1][1].append(line)
    return scrapes


def parse_vllm_metrics(text: str) -> VllmMetrics:
    """Parse one scrape (or the last complete one of several). Raises :class:`MetricsParseError`."""
    if not text.strip():
        raise MetricsParseError(None, "", "empty scrape")
    if text.endswith("\n"):
        help_names = _help_names(text)
        if len(set(help_names)) == len(help_names):  # one complete scrape: the agent's every cycle
            return _parse_scrape(text, 0)
    lines = text.split("\n")
    truncated = not text.endswith("\n")
    if truncated:
        lines_for_split = lines
    else:
        lines_for_split = lines[:-1]
    scrapes = split_scrapes(lines_for_split)
    last_error: MetricsParseError | None = None
    for index in range(len(scrapes) - 1, -1, -1):
        offset, chunk = scrapes[index]
        chunk_truncated = truncated and index == len(scrapes) - 1
        try:
            if chunk_truncated:
                raise MetricsParseError(offset + len(chunk), chunk[-1], "truncated scrape (no final newline)")
            return _parse_scrape("\n".join(chunk) + "\n", offset)
        except MetricsParseError as exc:
            last_error = last_error or exc
    assert last_error is not None
    raise last_error


def _alternatives(words) -> str:
    """A regular expression matching exactly ``words``, their common prefixes factored out: at a line start the
    engine follows one branch of the names instead of trying each name in turn."""
    words = sorted(set(words))
    prefix = os.path.commonprefix(words)
    if prefix or len(words) == 1:
        rest = [word[len(prefix):] for word in words]
        return re.escape(prefix) + (_alternatives(rest) if len(rest) > 1 else "")
    branches: dict[str, list[str]] = {}
    for word in words:
        if word:
            branches.setdefault(word[0], []).append(word[1:])
    parts = "|".join(re.escape(first) + _alternatives(rest) for first, rest in branches.items())
    return f"(?:{parts})" + ("?" if words[0] == "" else "")


_BLANKS = r"[^\S\n]"  # whitespace within a line (str.strip() strips the same characters)
# The lines read: after a newline and any blanks, a sample named in WANTED_SAMPLES (the name ends there), or a
# comment whose second and third words are HELP/TYPE and a family in WANTED (what the line walk keeps).
_READ_LINE = re.compile(
    rf"\n{_BLANKS}*+(?:{_alternatives(WANTED_SAMPLES)}(?![a-zA-Z0-9_:])"
    rf"|#\S*+{_BLANKS}++(?:HELP|TYPE){_BLANKS}++{_alternatives(WANTED)}(?!\S))[^\n]*+"
)
# split_scrapes' rule: the name ends at a space. Searched after a newline rather than at ^ with re.MULTILINE: the
# literal prefix lets the engine skip ahead, 8x faster on a 28 kB scrape (~190 -> ~24 us), as costly as the
# parse itself before, at every cycle of every IU.
_HELP_NAME = re.compile(r"\n# HELP ([^ \n]*)")


def _help_names(text: str) -> list[str]:
    """The name of every ``# HELP`` line, in order."""
    names = _HELP_NAME.findall(text)
    if text.startswith("# HELP "):
        names.insert(0, text[7:].split("\n", 1)[0].split(" ", 1)[0])
    return names


def _parse_scrape(text: str, offset: int) -> VllmMetrics:
    """One complete scrape (``text`` ends with a newline; its first line is line ``offset + 1``)."""
    padded = "\n" + text
    found = list(_READ_LINE.finditer(padded))
    kept = [m.group().strip() for m in found]
    if all(line.startswith("#") for line in kept):
        return _parse_checked_whole(text.split("\n")[:-1], offset)
    samples = _fast_samples(kept)

    def line_numbers() -> list[int]:  # worked out only when needed: the common case never does
        return [offset + padded.count("\n", 0, m.start() + 1) for m in found]

    numbers: list[int] = []
    if samples is None:  # some kept line is outside the common shape: prometheus_client decides
        numbers = line_numbers()
        for line, number, match in zip(kept, numbers, found, strict=True):
            if not line.startswith("#") and _SAMPLE_LINE.match(line) is None:
                raise MetricsParseError(number, match.group()[1:], "not a Prometheus sample line")
        samples = _library_samples(kept, numbers)
    try:
        return _fold(samples)
    except MetricsParseError as exc:
        raise _with_line(exc, kept, numbers or line_numbers()) from None


def _parse_checked_whole(lines: list[str], offset: int) -> VllmMetrics:
    """Every line checked for shape, the first that is not Prometheus text refused; for a scrape that has no
    family read (what it has is then no vLLM scrape or a broken one, and the error says where)."""
    kept: list[str] = []
    kept_line_numbers: list[int] = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            parts = stripped.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and _wanted_family(parts[2]):
                kept.append(stripped)
                kept_line_numbers.append(offset + i + 1)
            continue
        sample = _SAMPLE_LINE.match(stripped)
        if sample is None:
            raise MetricsParseError(offset + i + 1, line, "not a Prometheus sample line")
        if sample.group(1) in WANTED_SAMPLES:
            kept.append(stripped)
            kept_line_numbers.append(offset + i + 1)
    samples = _fast_samples(kept)
    if samples is None:
        samples = _library_samples(kept, kept_line_numbers)
    try:
        return _fold(samples)
    except MetricsParseError as exc:
        raise _with_line(exc, kept, kept_line_numbers) from None


def _with_line(exc: MetricsParseError, kept: list[str], numbers: list[int]) -> MetricsParseError:
    """A bad-value error of :func:`_fold` (which sees samples, not lines) with the first kept sample line whose
    value is non-finite or negative: the one an operator opens the scrape at."""
    if exc.line_no is not None:
        return exc
    for line, number in zip(kept, numbers, strict=True):
        # the value follows the labels' closing brace (label values come before it), else the name
        rest = "" if line.startswith("#") else line.rsplit("}", 1)[1] if "}" in line else line.partition(" ")[2]
        fields = rest.split()
        try:
            value = float(fields[0]) if fields else 0.0
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0:
            return MetricsParseError(number, line, "non-finite or negative sample")
    return exc


# The common shape of a scrape, as vLLM's prometheus_client writes it: comment lines "# HELP name text" and
# "# TYPE name type" with the type each family has in vLLM, sample lines "name{labels} value [timestamp]"
# with one space between the parts, labels name="value" pairs (escapes allowed), values spelled as the text
# format spells them. Such text is read here to the same names, labels and values as prometheus_client's
# parser reads it (tests/eas_agent/test_vllm_metrics.py compares both on every fixture and on the fault
# suite's scrapes), at a fraction of its cost: its label parser walks the text a character at a time, ~75 us
# per sample, most of the agent's CPU per cycle. Anything else (other types, which make it rename or regroup
# samples, other spellings, quoted names, __name__ labels) goes to prometheus_client, which decides.
_TYPES = {**dict.fromkeys([*GAUGES, KV_V1, KV_V0, PREFIX_HIT_RATE_V0], "gauge"), **dict.fromkeys(COUNTERS, "counter"),
          PROMPT_HISTOGRAM: "histogram", GENERATION_HISTOGRAM: "histogram"}
_COMMENT = re.compile(rf"# (HELP|TYPE) ({_METRIC_NAME})(?: (.*))?")
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL_VALUE = r'(?:[^"\\\n]|\\.)*'  # escapes kept as written: _unescape undoes them
_LABEL_PAIR = rf'{_LABEL_NAME}="{_LABEL_VALUE}"'
_VALUE = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?Inf|NaN"
_FAST_SAMPLE = re.compile(
    rf"({_METRIC_NAME})(?:\{{((?:{_LABEL_PAIR})(?:,{_LABEL_PAIR})*)?\}})? ({_VALUE})(?: -?[0-9]+)?"
)
_LABEL_PAIRS = re.compile(rf'({_LABEL_NAME})="({_LABEL_VALUE})"')
_ESCAPE = re.compile(r'\\([\\n"])')


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value) if "\\" in value else value


def _fast_samples(kept: list[str]) -> list[tuple[str, float, dict[str, str]]] | None:
    """(name, value, labels) of every kept sample line, None when the kept text is not of the common shape."""
    samples = []
    for line in kept:
        if line.startswith("#"):
            comment = _COMMENT.fullmatch(line)
            kind, family, rest = comment.groups() if comment is not None else (None, None, None)
            if kind is None or (kind == "TYPE" and (rest is None or rest != _TYPES.get(family))):
                return None
            continue
        match = _FAST_SAMPLE.fullmatch(line)
        if match is None:
            return None
        name, labels, value = match.groups()
        pairs = {k: _unescape(v) for k, v in _LABEL_PAIRS.findall(labels)} if labels else {}
        if "__name__" in pairs:
            return None
        samples.append((name, float(value), pairs))
    return samples


def _library_samples(kept: list[str], kept_line_numbers: list[int]) -> list[tuple[str, float, dict[str, str]]]:
    try:
        families = list(text_string_to_metric_families("\n".join(kept) + "\n"))
    except ValueError as exc:
        line_no, line = _locate(kept, kept_line_numbers)
        raise MetricsParseError(line_no, line, f"unparseable ({exc})") from exc
    return [(s.name, float(s.value), s.labels) for family in families for s in family.samples]


def _locate(kept: list[str], numbers: list[int]) -> tuple[int | None, str]:
    """Find the first kept line the parser rejects on its own (the parser's message has no line number)."""
    for line, number in zip(kept, numbers, strict=True):
        if line.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            return number, line
    return None, ""


def _fold(samples: list[tuple[str, float, dict[str, str]]]) -> VllmMetrics:
    sums: dict[str, float] = {}
    kv_v1: float | None = None
    kv_v0: float | None = None
    hit_rate: float | None = None
    engines: set[str] = set()
    warnings: list[str] = []

    def add(key: str, value: float) -> None:
        sums[key] = sums.get(key, 0.0) + value

    for name, value, labels in samples:
        # Prometheus text allows NaN/+Inf/-1e6, but no vLLM gauge or counter can be negative or
        # infinite: such a sample is a broken exporter, and scoring it would give a NaN or a negative
        # score that wins every pick. The IU goes unknown (warning) instead.
        if name == PREFIX_HIT_RATE_V0 and value == PREFIX_CACHING_OFF:
            continue  # prefix caching off: no hit rate, not a broken exporter
        if not math.isfinite(value) or value < 0:
            shown = ",".join(f"{k}={v!r}" for k, v in sorted(labels.items()))
            if name in UNSCORED:
                warnings.append(f"{name}{{{shown}}} {value}: non-finite or negative, left out (not scored)")
                continue
            raise MetricsParseError(
                None, f"{name}{{{shown}}} {value}", "non-finite or negative sample"
            )
        if name in GAUGES:
            add(GAUGES[name], value)
            engines.add(labels.get("engine", "") + "/" + labels.get("model_name", ""))
        elif name in COUNTERS:
            add(COUNTERS[name], value)
        elif name == KV_V1:
            kv_v1 = value if kv_v1 is None else max(kv_v1, value)
        elif name == KV_V0:
            kv_v0 = value if kv_v0 is None else max(kv_v0, value)
        elif name == PREFIX_HIT_RATE_V0:
            hit_rate = value if hit_rate is None else max(hit_rate, value)
        elif name in (PROMPT_HISTOGRAM + "_sum", PROMPT_HISTOGRAM + "_count"):
            add("prompt_tokens_" + name.rsplit("_", 1)[1], value)
        elif name in (GENERATION_HISTOGRAM + "_sum", GENERATION_HISTOGRAM + "_count"):
            add("generation_tokens_" + name.rsplit("_", 1)[1], value)
    schema = "v1" if kv_v1 is not None else "v0" if kv_v0 is not None else None
    return VllmMetrics(
        schema=schema,
        num_requests_running=sums.get("num_requests_running"),
        num_requests_waiting=sums.get("num_requests_waiting"),
        kv_cache_usage=kv_v1 if kv_v1 is not None else kv_v0,
        num_requests_swapped=sums.get("num_requests_swapped"),
        num_preemptions_total=sums.get("num_preemptions_total"),
        prompt_tokens_total=sums.get("prompt_tokens_total"),
        generation_tokens_total=sums.get("generation_tokens_total"),
        request_success_total=sums.get("request_success_total"),
        prefix_cache_queries_total=sums.get("prefix_cache_queries_total"),
        prefix_cache_hits_total=sums.get("prefix_cache_hits_total"),
        prefix_cache_hit_rate=hit_rate,
        prompt_tokens_sum=sums.get("prompt_tokens_sum"),
        prompt_tokens_count=sums.get("prompt_tokens_count"),
        generation_tokens_sum=sums.get("generation_tokens_sum"),
        generation_tokens_count=sums.get("generation_tokens_count"),
        engines=len(engines),
        warnings=tuple(warnings),
    )
