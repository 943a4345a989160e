"""Text prompts that do not fit, trimmed from their start (decision 0046).

A text job (the KoboldAI-style text API) carries no guarantee against
trimming: as KoboldAI and koboldcpp workers do on the AI Horde, the worker
keeps the END of a prompt that does not fit, so that its tokens plus
``max_length`` fit ``min(max_context_length, the declared context)``. Chat
jobs are never trimmed (``prompt_overflow_refused``).

The cost stays at one backend call a job in the common case: a prompt whose
UTF-8 bytes plus :data:`TEXT_MARGIN` fit is sent as is, uncounted (each token
covers at least one byte of the text, the argument of
:class:`~hordelite.worker._backend.TemplateBound`). Only a longer one is
tokenized, where the backend has an exact tokenizer (llama.cpp's server,
vLLM): over the limit, its last tokens are sent as a token array (both take
one on ``/v1/completions`` and add no BOS to it), behind the special tokens
(BOS) the backend puts before a text prompt, so it fits exactly. Without an
exact tokenizer (koboldcpp, Ollama, any OpenAI-compatible server) the prompt
keeps its last ``limit - TEXT_MARGIN`` bytes, cut at a character boundary:
at most that many tokens, so it fits too, keeping less than the most that
would.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from hordelite.worker._backend import Backend, BackendError

log = logging.getLogger("hordelite.worker")

# Tokens a text prompt may take above its UTF-8 byte length: the BOS token
# the backend adds, and the one prefix token a SentencePiece tokenizer may
# add (its leading space, a token of its own before a byte-fallback character).
TEXT_MARGIN = 2


class Tokenizer(Protocol):
    """A backend's own tokenizer: the token ids generation takes in for a text."""

    @property
    def name(self) -> str: ...

    async def tokenize(self, text: str, *, special: bool) -> list[int]:
        """The ids of ``text``, with the special tokens (BOS) generation
        adds before a text prompt when ``special``."""
        ...


def _ids(answer: Any, route: str) -> list[int]:
    ids = answer.get("tokens") if isinstance(answer, Mapping) else None
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise BackendError(f"{route} answered no token ids", down=False)
    return ids


class LlamaCppTokenizer:
    """llama.cpp's server: ``POST /tokenize`` ``{"content", "add_special",
    "parse_special"}``, special markers parsed as generation parses them."""

    name = "llama.cpp /tokenize"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def tokenize(self, text: str, *, special: bool) -> list[int]:
        body = {"content": text, "add_special": special, "parse_special": True}
        return _ids(await self.backend.post_json("/tokenize", body), "/tokenize")


class VllmTokenizer:
    """vLLM: ``POST /tokenize`` ``{"model", "prompt", "add_special_tokens"}``."""

    name = "vLLM /tokenize"

    def __init__(self, backend: Backend, model: str) -> None:
        self.backend = backend
        self.model = model

    async def tokenize(self, text: str, *, special: bool) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": special}
        return _ids(await self.backend.post_json("/tokenize", body), "/tokenize")


@dataclasses.dataclass(frozen=True)
class Trimmed:
    """A prompt trimmed to fit: what to send, and its size before and after
    in ``unit`` (tokens, or bytes without a tokenizer)."""

    prompt: str | list[int]
    before: int
    after: int
    unit: str


def keep_end(text: str, size: int) -> str:
    """The longest end of ``text`` of at most ``size`` UTF-8 bytes (whole characters)."""
    raw = text.encode()
    start = max(len(raw) - max(size, 0), 0)
    while start < len(raw) and raw[start] & 0xC0 == 0x80:  # a continuation byte
        start += 1
    return raw[start:].decode()


@dataclasses.dataclass(frozen=True)
class PromptTrimmer:
    """Fits a text prompt in ``limit`` tokens (see the module docstring).
    ``prefix`` is what ``tokenizer`` puts before any text with its special
    tokens (BOS), measured once on an empty text."""

    tokenizer: Tokenizer | None
    prefix: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        if self.tokenizer is None:
            return "cut to their last bytes at a character boundary (no exact tokenizer)"
        return f"cut to their last tokens by {self.tokenizer.name}"

    async def fit(self, prompt: str, limit: int) -> Trimmed | None:
        """The prompt trimmed from its start to at most ``limit`` tokens;
        None when it fits as it is."""
        size = len(prompt.encode())
        if size + TEXT_MARGIN <= limit:
            return None  # fits uncounted
        if self.tokenizer is None:
            end = keep_end(prompt, limit - TEXT_MARGIN)
            return Trimmed(end, size, len(end.encode()), "bytes")
        tokens = await self.tokenizer.tokenize(prompt, special=True)
        if len(tokens) <= limit:
            return None  # counted, and fits
        prefix = list(self.prefix) if tuple(tokens[: len(self.prefix)]) == self.prefix else []
        room = max(limit - len(prefix), 0)
        kept = prefix + tokens[max(len(tokens) - room, len(prefix)) :]
        return Trimmed(kept, len(tokens), len(kept), "tokens")


async def prompt_trimmer(backend: Backend, kind: str, model: str) -> PromptTrimmer:
    """The trimmer for a backend of ``kind``: its exact tokenizer where it
    has one that answers (its special prefix measured), else the byte cut.
    Raises BackendError when the backend does not answer."""
    tokenizer: Tokenizer | None = None
    if kind == "llamacpp":
        tokenizer = LlamaCppTokenizer(backend)
    elif kind == "vllm":
        tokenizer = VllmTokenizer(backend, model)
    if tokenizer is None:
        return PromptTrimmer(None)
    try:
        prefix = await tokenizer.tokenize("", special=True)
    except BackendError as exc:
        if exc.down:
            raise
        log.info("%s is not served (%s): text prompts are cut by bytes", tokenizer.name, exc)
        return PromptTrimmer(None)
    return PromptTrimmer(tokenizer, tuple(prefix))
