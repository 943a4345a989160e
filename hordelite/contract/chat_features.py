"""The chat declaration vocabulary (the conformance decision): capabilities, guarantees, limits.

Capabilities (``ChatFeature``) say the backend acts on an input; guarantees
(``ChatGuarantee``) say its reply follows one part of the contract exactly.
Both travel in a worker's ``chat_features`` list and in a request's
``required_chat_features``. Each name has a bit, so that "the worker's
declaration covers the request" is the SQL condition
``required & ~declared = 0`` and the queue can be indexed by the required set.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable


class ChatFeature(enum.Enum):
    seed = 1 << 0
    presence_penalty = 1 << 1
    frequency_penalty = 1 << 2
    reasoning_effort = 1 << 3
    vision = 1 << 4
    tools = 1 << 5
    json_object = 1 << 6
    json_schema = 1 << 7
    tools_with_response_format = 1 << 8


class ChatGuarantee(enum.Enum):
    tool_choice_enforced = 1 << 16
    single_tool_call_enforced = 1 << 17
    structured_output_enforced = 1 << 18
    prompt_overflow_refused = 1 << 19


_BY_NAME: dict[str, ChatFeature | ChatGuarantee] = {
    **{f.name: f for f in ChatFeature},
    **{g.name: g for g in ChatGuarantee},
}
ALL_NAMES = tuple(_BY_NAME)


def known_features(names: Iterable[str]) -> list[str]:
    """The names the horde knows, in vocabulary order; unknown names are ignored."""
    given = set(names)
    return [name for name in ALL_NAMES if name in given]


# Internal bits, never declared by name: how a request's images can reach a
# worker. hordelite forwards an image part as the client sent it, so an
# http(s) image needs a worker that fetches URLs ("url") and a data: image
# one that reads inline bytes ("base64").
IMAGE_TRANSPORT_BITS = {"url": 1 << 24, "base64": 1 << 25}
# A worker that fetches a large request's messages from one URL
# ("messages_url"). No request requires it: it chooses how the messages are
# handed at pop, never which worker may take the job.
MESSAGES_URL_BIT = 1 << 26


def transport_mask(transports: Iterable[str]) -> int:
    given = set(transports)
    mask = sum(IMAGE_TRANSPORT_BITS.get(t, 0) for t in given)
    return mask | (MESSAGES_URL_BIT if "messages_url" in given else 0)


def to_mask(names: Iterable[str]) -> int:
    mask = 0
    for name in names:
        member = _BY_NAME.get(name)
        if member is not None:
            mask |= member.value
    return mask


@dataclasses.dataclass(frozen=True)
class ChatWorkerLimits:
    """What a chat worker applies as sent: its context, its reply length, and
    the highest temperature it applies while tools are present (None: any)."""

    max_context_length: int
    max_length: int
    tools_max_temperature: float | None = None
