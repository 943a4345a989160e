"""The Unicode rules the horde applies to what it stores: the key under
which worker and user names are compared, the characters a user's name may
not carry, and the text no worker can send on.

Pure functions, no I/O; the storage queries and the service both use them.

- ``worker_name_key``: the normalised form of a worker's name (NFKC,
  case-folded, format and default-ignorable characters removed). Names with
  one key are one worker, so "Alice", "ALICE" and full-width "Alice" cannot be
  three workers of three owners. Control characters and lone surrogates
  are refused (400 naming the field): no display could show them.
- ``user_name_refusal``: why a user's name cannot be stored. A user's name
  is shown as ``name#id`` wherever the horde names a user, and looked up by
  its key (``fold_name``) as a worker's is: beyond the control characters
  refused in worker names, it may not hold a format character (bidi
  overrides, zero-width spaces and joiners: category Cf) nor a line or
  paragraph separator, which would let it read as another name or break
  the line it is shown on (decision 0073).
- ``unsendable``: where a stored JSON value holds something a worker cannot
  encode as UTF-8 JSON for its backend (a lone surrogate, or a number JSON
  cannot carry). A job holding one is faulted by any worker, through no
  fault of its own.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from hordelite.contract.limits import MAX_NAME_KEY
from hordelite.errors import bad_request

# Unicode's Default_Ignorable_Code_Point ranges that are not format (Cf)
# characters: the combining grapheme joiner, Hangul fillers, Khmer inherent
# vowels, Mongolian and other variation selectors, and unassigned code points
# reserved as ignorable. They render as nothing, so they do not tell names apart.
_IGNORABLE_RANGES: Final = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2065, 0x2065),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE0FFF),
)


# Where a name's refused characters can only be (category Cc or Cs).
_CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _ignorable(char: str) -> bool:
    if unicodedata.category(char) == "Cf":  # zero-width (non-)joiners, BOM, bidi marks
        return True
    point = ord(char)
    return any(low <= point <= high for low, high in _IGNORABLE_RANGES)


def _without_ignorables(text: str) -> str:
    return "".join(c for c in text if not _ignorable(c))


def fold_name(name: str) -> str:
    """The comparison form of a name, never refusing: NFKC (compatibility
    look-alikes such as full-width letters become the plain ones), case
    folded ("ß" matches "ss"), with the characters that render as nothing
    removed, and outer whitespace stripped. Normalised again after folding,
    which can undo NFKC (a fold may decompose a character)."""
    if name.isascii():
        # NFKC leaves ASCII as it is, no ASCII character is a format or
        # ignorable one, and its case fold is lower(): the common name costs
        # a pop no per-character walk.
        return name.lower().strip()
    text = unicodedata.normalize("NFKC", _without_ignorables(name))
    text = unicodedata.normalize("NFKC", text.casefold())
    return _without_ignorables(text).strip()


def worker_name_key(name: str, field: str = "name") -> str:
    """The key a worker name is stored and looked up under (``fold_name``).

    Raises HordeError 400 BadRequest naming ``field`` when the name holds a
    control character or a lone surrogate, when nothing visible is left once
    normalised, or when its key is longer than MAX_NAME_KEY characters.
    """
    # Only the controls and surrogates are looked at one by one: a pop's
    # name is read at every pop.
    suspects = _CONTROL_OR_SURROGATE.findall(name)
    problem, key = _name_key(name, suspects, _WORKER_NAME_REFUSED)
    if problem is not None:
        raise bad_request(field, problem)
    return key


# What a name may not hold, by Unicode category: a worker's, controls and
# surrogates; a user's, also Cf (format: bidi embeddings, overrides and
# isolates, zero-width space, joiners, BOM, soft hyphen), Zl and Zp (line
# and paragraph separators).
_WORKER_NAME_REFUSED: Final = {"Cc": "a control character", "Cs": "a lone surrogate"}
_USER_NAME_REFUSED: Final = {
    **_WORKER_NAME_REFUSED,
    "Cf": "a format or bidi control character",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


def user_name_refusal(name: str) -> str | None:
    """Why ``name`` (stripped) cannot be a user's name by its characters
    (its length and ``#`` are user_edit's rules), or None: a control or
    format character, a line or paragraph separator, or a key (``fold_name``)
    empty or longer than MAX_NAME_KEY characters."""
    return _name_key(name, name, _USER_NAME_REFUSED)[0]


def _name_key(
    name: str, chars: Iterable[str], refused: Mapping[str, str]
) -> tuple[str | None, str]:
    """Why ``name`` cannot be a name (the first of ``chars`` of a ``refused``
    category, or its key empty or too long), or None; and its key."""
    for char in chars:
        kind = unicodedata.category(char)
        if kind in refused:
            return f"must not hold {refused[kind]} (U+{ord(char):04X})", ""
    key = fold_name(name)
    if not key:
        return "must hold a visible character", key
    if len(key) > MAX_NAME_KEY:
        return f"is longer than {MAX_NAME_KEY} characters once normalised (NFKC)", key
    return None, key


def unsendable(value: Any) -> str | None:
    """The path (``params.stop_sequence[0]``, say) of the first string in a
    JSON value holding a lone surrogate, or of the first number that is not
    finite; None when the whole value can be sent as UTF-8 JSON.

    Walks with an explicit stack: a deeply nested value cannot exhaust the
    interpreter's recursion limit here.
    """
    for path, item in _leaves(value):
        if isinstance(item, str) and _has_surrogate(item):
            return path
        if isinstance(item, float) and not math.isfinite(item):
            return path
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _leaves(value: Any) -> Iterator[tuple[str, Any]]:
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            for key, child in reversed(item.items()):
                # The path names the key printably, even a key that fails.
                name = str(key).encode("utf-8", "backslashreplace").decode("utf-8")
                inner = f"{path}.{name}" if path else name
                yield inner, key  # keys are strings too
                stack.append((inner, child))
        elif isinstance(item, list | tuple):
            for index in reversed(range(len(item))):
                stack.append((f"{path}[{index}]", item[index]))
        else:
            yield path, item
