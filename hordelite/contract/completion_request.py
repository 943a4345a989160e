"""OpenAI's legacy completions body (``POST /v1/completions``) as a native
text request: validation, no I/O (decision 0057).

The call becomes a native text request, so it is queued, routed, priced and
judged as ``POST /api/v2/generate/text/async`` is: ``prompt`` is the prompt,
``max_tokens`` the ``max_length``, ``stop`` the ``stop_sequence``,
``temperature`` and ``top_p`` the samplers of the same names. OpenAI's
defaults are sent where the client left them out, and the backend samplers
OpenAI does not have are neutralised, as the chat front does, so that an
omission means the same on every worker. What the text path cannot honour
is refused naming its key, as the chat front refuses it: an unknown key, a
prompt of token ids or several prompts, ``n`` other than 1, ``logprobs``,
``suffix``, ``best_of`` above 1, a penalty other than 0, ``logit_bias``,
``seed`` (the text path has none to pass on).

The request's context (``max_context_length``) is chosen by
``completion_context`` from the online workers, unless the ``horde`` object
names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from hordelite.contract.admission import text_bytes
from hordelite.contract.chat_request import (
    AVAILABILITY_MODES,
    NEUTRAL_BACKEND_SAMPLERS,
    check_top_level,
    horde_flag,
    horde_object,
    invalid,
    openai_integer,
    openai_number,
    parse_horde_workers,
    parse_models,
    parse_stop,
    parse_stream_options,
    unsupported,
)
from hordelite.contract.eligibility import WorkerView, can_serve
from hordelite.contract.limits import (
    MAX_CONTEXT_LENGTH,
    MAX_MAX_LENGTH,
    MIN_CONTEXT_LENGTH,
)
from hordelite.contract.text import SAMPLING_BOOLS, SAMPLING_INTS, SAMPLING_NUMBERS, TextRequest
from hordelite.errors import RC, HordeError

# OpenAI's default budget of a legacy completion (its API reference).
DEFAULT_MAX_TOKENS = 16
# The tokens a backend may add before a prompt (the BOS token and a
# SentencePiece prefix token; decision 0046).
PROMPT_TOKENS_ADDED = 2

# Top-level keys accepted only at their default, which counts as omitted.
_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "logprobs": (0, False),
    "suffix": ("",),
    "logit_bias": ({},),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
}
_KNOWN_TOP = frozenset(
    {
        "model",
        "models",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
        "stream",
        "stream_options",
        "echo",
        "horde",
    }
)
_HORDE_KEYS = frozenset(
    {
        "availability_mode",
        "max_context_length",
        "workers",
        "worker_blacklist",
        "trusted_workers",
        "slow_workers",
        "nsfw",
        *SAMPLING_NUMBERS,
        *SAMPLING_INTS,
        *SAMPLING_BOOLS,
    }
)


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """A legacy completions call: the native text request it queues (its
    ``max_context_length`` still to be chosen when ``context`` is None), and
    what the front does with the answer."""

    text: TextRequest
    stream: bool
    include_usage: bool
    echo: bool
    availability_mode: str
    context: int | None  # the horde object's max_context_length

    @property
    def fail_fast(self) -> bool:
        return self.availability_mode == "fail_fast"


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a legacy completions body; raises HordeError naming the key."""
    check_top_level(body, _KNOWN_TOP, _DEFAULT_ONLY)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", "Invalid type for 'stream': expected a boolean.")
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise invalid("echo", "Invalid type for 'echo': expected a boolean.")
    horde = horde_object(body.get("horde") or {}, _HORDE_KEYS)
    max_tokens = _max_tokens(body.get("max_tokens"))
    context = _context(horde.get("max_context_length"), max_tokens)
    params: dict[str, Any] = {
        "max_length": max_tokens,
        "max_context_length": context or max_tokens,
        **_sampling(body, horde),
    }
    stops = parse_stop(body.get("stop"))
    if stops:
        params["stop_sequence"] = stops
    workers = parse_horde_workers(horde.get("workers"))
    text = TextRequest(
        prompt=_prompt(body.get("prompt")),
        params=params,
        n=1,
        max_length=max_tokens,
        max_context_length=context or max_tokens,
        models=parse_models(body),
        workers=workers,
        worker_blacklist=horde_flag(horde, "worker_blacklist", False),
        trusted_workers=horde_flag(horde, "trusted_workers", False),
        slow_workers=horde_flag(horde, "slow_workers", True),
        nsfw=horde_flag(horde, "nsfw", False),
        softprompt=None,
        dry_run=False,
        allow_downgrade=False,
        proxied_account=None,
        webhook=None,
    )
    mode = horde.get("availability_mode", AVAILABILITY_MODES[0])
    if mode not in AVAILABILITY_MODES:
        raise unsupported(
            "horde.availability_mode",
            f"Invalid value for 'horde.availability_mode': {mode!r}; "
            f"supported values are {', '.join(AVAILABILITY_MODES)}.",
        )
    return CompletionRequest(
        text=text,
        stream=bool(stream),
        include_usage=parse_stream_options(body.get("stream_options"), bool(stream)),
        echo=bool(echo),
        availability_mode=str(mode),
        context=context,
    )


def _prompt(value: Any) -> str:
    """One prompt: a string, or an array of exactly one string."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise unsupported("prompt", "A prompt of token ids is not supported: send text.")
        raise unsupported("prompt", "Send one prompt: several in one call are not supported.")
    if not isinstance(value, str):
        raise invalid("prompt", "'prompt' is required: a string.")
    if not value:
        raise HordeError(RC.MissingPrompt, param="prompt")
    return value


def _max_tokens(value: Any) -> int:
    max_tokens = openai_integer("max_tokens", value, 1, MAX_MAX_LENGTH)
    return DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens


def _context(value: Any, max_tokens: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid("horde.max_context_length", "'horde.max_context_length' must be an integer.")
    low = max(MIN_CONTEXT_LENGTH, max_tokens)
    if not low <= value <= MAX_CONTEXT_LENGTH:
        raise invalid(
            "horde.max_context_length",
            f"'horde.max_context_length' must be {low} to {MAX_CONTEXT_LENGTH} "
            "(at least max_tokens).",
        )
    return value


def _sampling(body: Mapping[str, Any], horde: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's samplers at their defaults where left out, the backend's own
    neutral unless the horde object sets them, each within the text path's
    bounds."""
    temperature = openai_number(body, "temperature", 0.0, 2.0)
    top_p = openai_number(body, "top_p", 0.0, 1.0)
    if top_p is not None and top_p < SAMPLING_NUMBERS["top_p"][0]:
        raise unsupported(
            "top_p",
            f"Invalid 'top_p': {top_p} is below {SAMPLING_NUMBERS['top_p'][0]}, "
            "the least the text path's workers take.",
        )
    out: dict[str, Any] = {
        **NEUTRAL_BACKEND_SAMPLERS,
        "temperature": 1.0 if temperature is None else temperature,
        "top_p": 1.0 if top_p is None else top_p,
    }
    for key, (lo, hi) in SAMPLING_NUMBERS.items():
        if horde.get(key) is not None:
            out[key] = openai_number(horde, key, lo, hi, f"horde.{key}")
    for key, (ilo, ihi) in SAMPLING_INTS.items():
        value = horde.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not ilo <= value <= ihi:
            raise invalid(f"horde.{key}", f"'horde.{key}' must be an integer from {ilo} to {ihi}.")
        out[key] = value
    for key in SAMPLING_BOOLS:
        if horde.get(key) is not None:
            out[key] = horde_flag(horde, key, False)
    return out


@dataclasses.dataclass(frozen=True)
class Context:
    """The context a completion is routed with, and whether its prompt may
    not fit in it (its worker then keeps the prompt's end, decision 0046)."""

    length: int
    may_trim: bool


def prompt_fits(prompt: str, max_tokens: int) -> int:
    """The context that certainly holds ``prompt`` and ``max_tokens`` more:
    a token covers at least one byte of the text (decision 0045), and a
    backend adds at most PROMPT_TOKENS_ADDED before it."""
    return text_bytes(prompt) + PROMPT_TOKENS_ADDED + max_tokens


def completion_offers(req: TextRequest, online: Sequence[WorkerView]) -> list[int]:
    """The contexts of the online workers that could take ``req`` whatever
    its context: every other rule of eligibility holds."""
    view = req.eligibility(max_context_length=0)
    return [w.max_context_length for w in online if can_serve(w, view)]


def completion_context(req: CompletionRequest, offered: Sequence[int]) -> Context:
    """The request's context: the horde object's when it names one; else the
    smallest context an online worker able to take it offers that certainly
    holds the prompt (so every worker offering at least that is eligible,
    and none trims), else the largest offered (the prompt may be trimmed
    from its start), else, with no such worker online, what certainly
    holds it (bounded by MAX_CONTEXT_LENGTH)."""
    need = prompt_fits(req.text.prompt, req.text.max_length)
    if req.context is not None:
        return Context(req.context, need > req.context)
    fitting = [c for c in offered if c >= need]
    if fitting:
        return Context(min(fitting), False)
    if offered:
        return Context(max(offered), True)
    length = max(min(need, MAX_CONTEXT_LENGTH), MIN_CONTEXT_LENGTH)
    return Context(length, need > length)


def with_context(req: CompletionRequest, context: Context) -> TextRequest:
    """The native text request, routed with ``context``."""
    params = {**req.text.params, "max_context_length": context.length}
    return dataclasses.replace(req.text, params=params, max_context_length=context.length)
