"""Fuzz every parser: mutated real outputs either parse to contract JSON that is
strict JSON, or raise ParseError; never another exception. Fixed seeds, stdlib random: a failure names
the seed, kind, fixture and mutation so it can be replayed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from preflight.parsers import PARSERS, ParseError, parse, to_contract_json

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parents[3] / "fixtures" / "preflight"
ROUNDS = 40  # per fixture: every kind (29 kinds, 271 fixtures) x 40 = 10,840 inputs
TOKENS = ["NaN", "-1", "1e400", "", "x", "nGpus", "N/A", "Yes", "<===", "# c", "...", "\t", ":", "(", "]", "-", "0x"]


def mutate(rng: random.Random, text: str) -> tuple[str, str]:
    lines = text.split("\n")
    op = rng.choice(["delete", "duplicate", "truncate", "token", "swap", "garbage", "strip_numbers", "join"])
    i = rng.randrange(len(lines))
    if op == "delete":
        del lines[i]
    elif op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "truncate":
        return op, text[: rng.randrange(len(text) + 1)]
    elif op == "token":
        words = lines[i].split(" ")
        words[rng.randrange(len(words))] = rng.choice(TOKENS)
        lines[i] = " ".join(words)
    elif op == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "garbage":
        lines.insert(i, "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(1, 60))))
    elif op == "strip_numbers":
        lines[i] = "".join(c for c in lines[i] if not c.isdigit())
    elif op == "join" and i + 1 < len(lines):
        lines[i : i + 2] = [lines[i] + lines[i + 1]]
    return op, "\n".join(lines)


def fixtures(kind: str) -> list[Path]:
    return sorted((FIXTURES / kind.replace("-", "_")).glob("*.txt"))


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_parser_raises_only_parse_error(kind):
    tried = parsed = refused = 0
    for n, path in enumerate(fixtures(kind)):
        original = path.read_text(errors="replace")
        rng = random.Random(1500 + n)
        for round_no in range(ROUNDS):
            text = original
            ops = []
            for _ in range(rng.randint(1, 3)):
                op, text = mutate(rng, text)
                ops.append(op)
            tried += 1
            try:
                result = parse(kind, text)
            except ParseError:
                refused += 1
                continue
            except Exception as exc:  # the contract: nothing but ParseError
                raise AssertionError(f"{kind} {path.name} seed {1500 + n} round {round_no} {ops}: {exc!r}") from exc
            json.dumps(to_contract_json(kind, result), allow_nan=False)
            parsed += 1
    assert tried == parsed + refused and tried >= ROUNDS * 5
    print(f"{kind}: {tried} mutated inputs, {parsed} parsed, {refused} refused with ParseError")


def test_nccl_ngpus_without_a_number_is_a_parse_error():
    """int(... "nGpus" + 1) raised ValueError for a token the marker regex accepted ("8x")."""
    base = (FIXTURES / "nccl" / "h100-sxm-8gpu-all_reduce-g8-single-node.txt").read_text()
    for bad in ("# nThread 1 nGpus 8x minBytes 8", "# nThread 1 nGpus 8: minBytes 8"):
        text = base.replace(base.split("\n")[1], bad)
        with pytest.raises(ParseError, match="nGpus"):
            parse("nccl", text)


def test_malformed_pastes_only_ever_give_a_parse_error(tally):
    total = 0
    kinds = [kind for kind in sorted(PARSERS) if fixtures(kind)]
    assert kinds == sorted(PARSERS)  # every parser has fixtures to mutate
    for kind in kinds:
        for n, path in enumerate(fixtures(kind)):
            rng = random.Random(2500 + n)
            original = path.read_text(errors="replace")
            for _ in range(25):
                _, text = mutate(rng, original)
                total += 1
                try:
                    json.dumps(to_contract_json(kind, parse(kind, text)), allow_nan=False)
                except ParseError:
                    pass
    tally.inputs(f"pasted tool outputs ({len(kinds)} parsers)", total)
