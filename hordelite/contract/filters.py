"""Prompt filters (docs/reference/filters.md): the rules an admin writes,
how a text is normalised before they are matched, and what a screen of a
request's texts decides. Pure: no I/O.

A rule is the AI Horde's filter (``regex``, ``filter_type`` 10..29,
``description``, ``replacement``) with hordelite's ``action``: ``refuse``
(the request is refused, 400 CorruptPrompt), ``flag`` (served, and recorded
in the audit trail) or ``replace`` (the matched text replaced by
``replacement``, as the AI Horde's replacement filters do).

Every regex is compiled by RE2 (google-re2), whose matching is linear in the
text: no rule can backtrack without bound, whatever an admin writes or a
client sends. A rule RE2 cannot compile (a backreference, a lookaround) is
refused when it is written. All the rules run in one pass over a text (an
RE2 set); only the rules that matched are run again, for what they matched.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import re2

from hordelite.contract.limits import (
    FILTER_RE2_MEMORY,
    MAX_FILTER_REGEX_CHARS,
    MAX_FILTER_TEXT_CHARS,
    MAX_FILTER_TYPE,
    MIN_FILTER_TYPE,
)
from hordelite.errors import RC, HordeError, bad_request

ACTIONS = ("refuse", "flag", "replace")
DEFAULT_ACTION = "refuse"


def _options() -> Any:
    options = re2.Options()
    options.case_sensitive = False  # the text is case-folded; a rule's capitals still match
    options.max_mem = FILTER_RE2_MEMORY
    options.log_errors = False  # a refused rule is the admin's answer, not a log line
    return options


_OPTIONS = _options()

# Normalisation's own patterns, RE2 too: linear on any text.
# A prompt weight, "(word:1.2)" -> "word" (the AI Horde's weight_remover).
# Python's re, whose sub runs in C: linear all the same, as its class
# excludes the delimiters, so no character is scanned from two openings.
_WEIGHT = re.compile(r"\(([^():]*):\s*-?[0-9]+(?:\.[0-9]+)?\)")
# Runs of this many single characters or more, space separated, are joined.
_SPACED_RUN = 3


def normalise(text: str) -> str:
    """``text`` as the rules see it: NFKC, format characters (zero-width)
    removed, case-folded, accents stripped (NFKD less its combining marks),
    prompt weights "(word:1.2)" removed, punctuation and "_" as spaces,
    whitespace collapsed to single spaces, and runs of three or more
    spaced single characters joined ("s e x" -> "sex"). Linear in the text.

    ASCII text, most prompts, takes a shorter way to the same result (no
    Unicode step changes it; its punctuation is a table lookup), about a
    tenth of the cost (bench/filters.py)."""
    if not text.isascii():
        return _normalised(text)
    text = text.lower()
    if "(" in text:
        text = _WEIGHT.sub(r"\1", text)
    return " ".join(_join_spaced(text.translate(_ASCII_PUNCTUATION).split()))


def _normalised(text: str) -> str:
    """``normalise`` of any text, every step. Format characters and marks
    go together, after the decomposition (neither case folding nor NFKD
    changes a format character), by a table: one C pass."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _WEIGHT.sub(r"\1", unicodedata.normalize("NFKD", text))
    return " ".join(_join_spaced(text.translate(_table()).split()))


@functools.cache
def _table() -> dict[int, str | None]:
    """What str.translate does to a decomposed text, in one C pass: every
    format character (zero-width spaces and joiners, bidi controls, soft
    hyphens) and combining mark (accents, once decomposed) removed; every
    other assigned character that is neither a letter nor a number
    (punctuation, symbols, controls, separators) and "_" as a space (the AI
    Horde's whitespace_converter). Built on the first text that is not
    ASCII (about 0.3 s, once a process)."""
    table: dict[int, str | None] = {}
    for c in range(sys.maxunicode + 1):
        category = unicodedata.category(chr(c))
        if category in ("Cf", "Mn", "Mc", "Me"):
            table[c] = None
        elif category[0] in "PSZ" or category == "Cc":
            table[c] = " "
    return table


# What _table does to ASCII: every character but a letter or a digit
# becomes a space (whitespace too, which split() then reads as one).
_ASCII_PUNCTUATION = {c: " " for c in range(128) if not chr(c).isalnum()}


def _join_spaced(tokens: list[str]) -> Iterable[str]:
    """The tokens with each run of _SPACED_RUN or more single characters
    joined into one word (the AI Horde's whitespace_remover, also at the
    start of the text)."""
    run: list[str] = []
    for token in tokens:
        if len(token) == 1:
            run.append(token)
            continue
        yield from _flush(run)
        run = []
        yield token
    yield from _flush(run)


def _flush(run: list[str]) -> list[str]:
    return ["".join(run)] if len(run) >= _SPACED_RUN else run


# Rules -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FilterSpec:
    """A rule as written (PUT /filters, ``hordelite filters add``)."""

    regex: str
    filter_type: int
    description: str | None = None
    replacement: str = ""
    action: str = DEFAULT_ACTION


@dataclasses.dataclass(frozen=True)
class FilterEdit:
    """A change to a rule (PATCH /filters/{id}): the fields given."""

    regex: str | None = None
    filter_type: int | None = None
    description: str | None = None
    replacement: str | None = None
    action: str | None = None

    def applied(self, spec: FilterSpec) -> FilterSpec:
        changes = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return dataclasses.replace(spec, **changes)


def compile_regex(regex: str) -> Any:
    """The RE2 program of a rule's regex; 400 naming ``regex`` when it is
    too long, RE2 cannot compile it (backreferences, lookaround, possessive
    repetition), or it matches every text (the empty string)."""
    if not regex:
        raise bad_request("regex", "must be a non-empty string")
    if len(regex) > MAX_FILTER_REGEX_CHARS:
        raise bad_request("regex", f"must have at most {MAX_FILTER_REGEX_CHARS} characters")
    try:
        program = re2.compile(regex, _OPTIONS)
    except re2.error as exc:
        why = exc.args[0].decode("utf-8", "replace") if exc.args else "invalid"
        raise bad_request(
            "regex",
            f"RE2 cannot compile it ({why}); backreferences and lookaround are not supported",
        ) from None
    if program.search("") is not None:
        raise bad_request("regex", "matches every text (it matches the empty string)")
    return program


def parse_filter(body: Any) -> FilterSpec:
    """A new rule's body; 400 naming the field at fault."""
    if not isinstance(body, Mapping):
        raise bad_request("body", "must be a JSON object")
    regex = _text(body, "regex", MAX_FILTER_REGEX_CHARS, required=True)
    assert regex is not None
    compile_regex(regex)
    return FilterSpec(
        regex=regex,
        filter_type=_filter_type(body.get("filter_type"), required=True),
        description=_text(body, "description", MAX_FILTER_TEXT_CHARS),
        replacement=_text(body, "replacement", MAX_FILTER_TEXT_CHARS) or "",
        action=_action(body.get("action")) or DEFAULT_ACTION,
    )


def parse_filter_edit(body: Any) -> FilterEdit:
    """A change's body: the fields given (null: not changed); 400
    NoFilterModSelected when none is."""
    if not isinstance(body, Mapping):
        raise bad_request("body", "must be a JSON object")
    regex = _text(body, "regex", MAX_FILTER_REGEX_CHARS)
    if regex is not None:
        compile_regex(regex)
    edit = FilterEdit(
        regex=regex,
        filter_type=_filter_type(body.get("filter_type"), required=False),
        description=_text(body, "description", MAX_FILTER_TEXT_CHARS),
        replacement=_text(body, "replacement", MAX_FILTER_TEXT_CHARS),
        action=_action(body.get("action")),
    )
    if edit == FilterEdit():
        raise HordeError(RC.NoFilterModSelected)
    return edit


def parse_filter_type(value: Any, field: str = "filter_type") -> int | None:
    """An optional filter type (a query's or a test's): None when absent."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    found: int | None = _filter_type(value, required=False, field=field)
    return found


def _filter_type(value: Any, *, required: bool, field: str = "filter_type") -> Any:
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(field, f"must be an integer from {MIN_FILTER_TYPE} to {MAX_FILTER_TYPE}")
    if not MIN_FILTER_TYPE <= value <= MAX_FILTER_TYPE:
        raise bad_request(field, f"must be from {MIN_FILTER_TYPE} to {MAX_FILTER_TYPE}")
    return value


def _text(body: Mapping[str, Any], field: str, limit: int, *, required: bool = False) -> Any:
    value = body.get(field)
    if value is None:
        if required:
            raise bad_request(field, "is required")
        return None
    if not isinstance(value, str):
        raise bad_request(field, "must be a string")
    if len(value) > limit:
        raise bad_request(field, f"must have at most {limit} characters")
    return value


def _action(value: Any) -> str | None:
    if value is None:
        return None
    if value not in ACTIONS:
        raise bad_request("action", f"must be one of {', '.join(ACTIONS)}")
    return str(value)


# Screening ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Rule:
    """A stored rule, compiled."""

    id: int
    filter_type: int
    action: str
    replacement: str
    program: Any

    def replace(self, text: str) -> str:
        # A literal replacement: no group references in an admin's text.
        return str(self.program.sub(lambda _m: self.replacement, text))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a screen decided: the ids of the rules that matched, by action
    (in id order), and the texts as they are to be stored (the same texts
    when no rule replaced any)."""

    refused: tuple[int, ...] = ()
    flagged: tuple[int, ...] = ()
    replaced: tuple[int, ...] = ()
    texts: tuple[str, ...] = ()

    @property
    def matched(self) -> tuple[int, ...]:
        return tuple(sorted(self.refused + self.flagged + self.replaced))


@dataclasses.dataclass(frozen=True)
class Screened:
    """A request a screen refused or flagged, as the audit trail records it:
    ``action`` (``request.refused`` or ``request.flagged``), the ids of the
    rules it matched, its ``kind`` (text, chat) and the client address it
    came from (None: not known). Never its prompt."""

    action: str
    filter_ids: tuple[int, ...]
    kind: str
    client: str | None


class FilterSet:
    """The compiled rules of a horde, screened in one RE2 pass per text."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(sorted(rules, key=lambda r: r.id))
        self._set: Any = None
        if self.rules:
            found = re2.Set.SearchSet(_OPTIONS)
            for rule in self.rules:
                found.Add(rule.program.pattern)
            found.Compile()
            self._set = found

    def __len__(self) -> int:
        return len(self.rules)

    def matching(self, normalised: str) -> list[Rule]:
        """The rules matching a normalised text, in id order."""
        if self._set is None:
            return []
        try:
            hits = self._set.Match(normalised)
        except Exception:  # the set ran out of its memory: each rule alone
            return [r for r in self.rules if r.program.search(normalised) is not None]
        return [self.rules[i] for i in sorted(hits or ())]

    def screen(self, texts: Sequence[str]) -> Verdict:
        """The verdict on a request's texts (a prompt, or each message's
        text): every rule matched against each normalised text as sent;
        the replace rules that matched applied to the texts."""
        if self._set is None:
            return Verdict(texts=tuple(texts))
        by_text = [self.matching(normalise(t)) for t in texts]
        hit = {r.id: r for found in by_text for r in found}
        ids = {a: tuple(sorted(i for i, r in hit.items() if r.action == a)) for a in ACTIONS}
        out = tuple(
            _replaced(t, [r for r in found if r.action == "replace"])
            for t, found in zip(texts, by_text, strict=True)
        )
        return Verdict(ids["refuse"], ids["flag"], ids["replace"], out)

    def suspicion(self, prompt: str, filter_type: int | None = None) -> tuple[int, list[str]]:
        """POST /filters: the AI Horde's suspicion of a prompt (how many
        groups, types 10-19 and 20-29, have a rule matching it) and what
        each matching rule matched in the normalised prompt."""
        normalised = normalise(prompt)
        found = [
            r
            for r in self.matching(normalised)
            if filter_type is None or r.filter_type == filter_type
        ]
        matches = []
        for rule in found:
            match = rule.program.search(normalised)
            if match is not None:
                matches.append(str(match.group(0)))
        return len({r.filter_type // 10 for r in found}), matches


def _replaced(text: str, rules: list[Rule]) -> str:
    """``text`` with the replace rules applied: to the text as sent (its
    punctuation, case and lines kept); when a rule still matches the
    result's normalised form (the match was hidden by a trick: spacing,
    accents, zero-width characters), to the normalised text, as the AI
    Horde applies its replacement filters."""
    if not rules:
        return text
    for rule in rules:
        text = rule.replace(text)
    normalised = normalise(text)
    if any(r.program.search(normalised) is not None for r in rules):
        text = normalised
        for rule in rules:
            text = rule.replace(text)
    return text


def combined_regex(regexes: Iterable[str]) -> str:
    """GET /filters/regex: a type's rules as one regex, as the AI Horde
    answers it (each rule's regex joined by "|", in id order)."""
    return "|".join(regexes)


def chat_texts(messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, int | None, str]]:
    """Every text of a chat request's messages, as (message index, part
    index or None for a string content, text): what a screen reads."""
    out: list[tuple[int, int | None, str]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str):
            out.append((i, None, content))
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    out.append((i, j, part["text"]))
    return out


def with_chat_texts(
    messages: list[dict[str, Any]],
    places: Sequence[tuple[int, int | None, str]],
    texts: Sequence[str],
) -> list[dict[str, Any]]:
    """``messages`` with the texts at ``places`` (``chat_texts``) changed to
    ``texts`` (copies: the request as parsed is left as it was)."""
    out = [dict(m) for m in messages]
    for (i, j, before), after in zip(places, texts, strict=True):
        if after == before:
            continue
        if j is None:
            out[i]["content"] = after
        else:
            parts = [dict(p) for p in out[i]["content"]]
            parts[j]["text"] = after
            out[i]["content"] = parts
    return out
