"""What prompt filters cost (docs/reference/filters.md), in CPU, in process.

1. Catastrophic rules: ``(a+)+$`` and ``(a|aa)+b`` against a 100 KB hostile
   prompt ("aaa...!"), screened as the horde screens a request (normalised,
   then every rule in one RE2 pass). The baseline, measured in the same run:
   Python's ``re`` on the same rules against a short prefix of the same
   input (``--re-chars``, 26 by default), whose time doubles with each
   character more (it is not run on the 100 KB: it would not end).
2. The screen of a typical chat request (``--messages`` messages of about
   ``--chars`` characters) by ``--filters`` rules (word lists, a few
   alternations and classes, as an operator writes them), per request;
   against the same request with no filter (the baseline: nothing to do)
   and Python's ``re`` running the same rules one by one.

    .venv/bin/python bench/filters.py [--filters 100] [--repeat 200]

Figures are CPU seconds (time.process_time), each the median of
``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable

from hordelite.contract.filters import FilterSet, Rule, compile_regex, normalise

CATASTROPHIC = ["(a+)+$", "(a|aa)+b"]
WORDS = [
    "dragon", "kitten", "castle", "wizard", "potion", "goblin", "dungeon", "knight",
    "sword", "shield", "forest", "river", "mountain", "tavern", "merchant", "thief",
]  # fmt: skip


def _cpu(fn: Callable[[], object], repeat: int, rounds: int) -> float:
    """The median CPU seconds of one call of ``fn``."""
    figures = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(repeat):
            fn()
        figures.append((time.process_time() - start) / repeat)
    return statistics.median(figures)


def _rules(count: int) -> list[str]:
    """``count`` rules as an operator writes them."""
    out = []
    for i in range(count):
        a, b = WORDS[i % len(WORDS)], WORDS[(i * 7 + 3) % len(WORDS)]
        shapes = [
            f"\\b{a}{i}\\b",
            f"{a}s? (of|with) {b}{i}",
            f"[0-9]{{2,4}} {b}{i}",
            f"{a}{i}|{b}{i}x",
        ]
        out.append(shapes[i % len(shapes)])
    return out


def _set(regexes: list[str]) -> FilterSet:
    return FilterSet(
        [Rule(i + 1, 10, "refuse", "", compile_regex(r)) for i, r in enumerate(regexes)]
    )


def catastrophic(rounds: int, re_chars: int) -> None:
    hostile = "a" * 100_000 + "!"
    found = _set(CATASTROPHIC)
    re2_seconds = _cpu(lambda: found.screen([hostile]), 5, rounds)
    short = hostile[:re_chars] + "!"
    compiled = [re.compile(r) for r in CATASTROPHIC]
    re_seconds = _cpu(lambda: [p.search(short) for p in compiled], 1, rounds)
    longer = hostile[: re_chars + 2] + "!"
    re_longer = _cpu(lambda: [p.search(longer) for p in compiled], 1, rounds)
    print("catastrophic rules (a+)+$ and (a|aa)+b:")
    print(f"  re2 screen, 100 KB hostile prompt: {re2_seconds * 1e3:8.2f} ms")
    print(f"  Python re, {re_chars + 1}-character prefix:   {re_seconds * 1e3:8.2f} ms")
    print(f"  Python re, {re_chars + 3}-character prefix:   {re_longer * 1e3:8.2f} ms")
    print(f"  re (on {re_chars + 1} characters) / re2 (on 100 KB): {re_seconds / re2_seconds:.1f}x")
    # Other 100 KB prompts aimed at the normalisation's steps.
    for name, text in [
        ("spaced single letters", "a " * 50_000),
        ("unclosed weights", "(a:" * 33_000),
        ("zero-width and accents", "e\u200b\u0301" * 33_000),
        ("punctuation, not ASCII", "\u00e9!" * 50_000),
        ("weights, not ASCII", "(\u00e9:1.5)" * 14_000),
    ]:
        seconds = _cpu(lambda text=text: found.screen([text]), 5, rounds)  # type: ignore[misc]
        print(f"  re2 screen, 100 KB of {name}: {seconds * 1e3:8.2f} ms")


def chat_screen(count: int, messages: int, chars: int, repeat: int, rounds: int) -> None:
    sentence = "The knight walks into the tavern and asks the merchant about the river. "
    texts = [(sentence * (chars // len(sentence) + 1))[:chars] for _ in range(messages)]
    regexes = _rules(count)
    found = _set(regexes)
    empty = FilterSet([])
    compiled = [re.compile(r, re.IGNORECASE) for r in regexes]

    def python_re() -> None:
        for text in texts:
            normalised = normalise(text)
            for p in compiled:
                p.search(normalised)

    none = _cpu(lambda: empty.screen(texts), repeat, rounds)
    norm = _cpu(lambda: [normalise(t) for t in texts], repeat, rounds)
    screen = _cpu(lambda: found.screen(texts), repeat, rounds)
    one_by_one = _cpu(python_re, repeat, rounds)
    size = sum(len(t) for t in texts)
    print(f"a chat request of {messages} messages, {size} characters, {count} rules:")
    print(f"  no filter (baseline):              {none * 1e6:8.1f} us")
    print(f"  normalisation alone:               {norm * 1e6:8.1f} us")
    print(f"  screen (normalise + one RE2 pass): {screen * 1e6:8.1f} us")
    print(f"  Python re, rule by rule:           {one_by_one * 1e6:8.1f} us")
    print(f"  screen / Python re: {screen / one_by_one:.2f}")
    compile_seconds = _cpu(lambda: _set(regexes), 1, rounds)
    print(f"  compiling the {count} rules (once per change): {compile_seconds * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--filters", type=int, default=100, help="rules in the chat screen")
    parser.add_argument("--messages", type=int, default=8)
    parser.add_argument("--chars", type=int, default=400, help="characters per message")
    parser.add_argument("--repeat", type=int, default=200, help="screens per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--re-chars", type=int, default=24, help="the re baseline's input")
    args = parser.parse_args()
    catastrophic(args.rounds, args.re_chars)
    chat_screen(args.filters, args.messages, args.chars, args.repeat, args.rounds)


if __name__ == "__main__":
    main()
