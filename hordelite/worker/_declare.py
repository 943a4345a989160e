"""The chat declaration, from what the backend proves at start (the chat
specification: worker guide step 1, and "Prompt fit on the worker").

The model id and the context come from the backend (flags override them);
capabilities from the operator's ``features``, except ``vision``, declared
(with the ``url`` and ``base64`` image transports) only when the backend
says it reads images: the worker fetches a signed URL itself and hands the
backend every image inline, so either transport serves it. The guarantee
``prompt_overflow_refused`` is declared only when the fit check is backed:
by the backend's own counter, shown on a probe conversation not to count
fewer tokens than the backend's ``usage.prompt_tokens``, or else by the
byte-length bound plus the template overhead the probe measured (and, for a
worker declaring tools, the operator's ``template_overhead`` for the tool
preamble the probe cannot see).

Behind an exact counter that backs the guarantee, the worker also measures
the template's overheads with it once (``TemplateBound``): a job whose
conversation that bound shows to fit is sent without counting it, one call
to the backend; only a conversation the bound cannot clear is counted.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
from collections.abc import Collection
from typing import Any

from hordelite.config import WorkerConfig
from hordelite.contract.chat_features import ChatFeature, ChatGuarantee, known_features
from hordelite.contract.limits import MAX_NAME
from hordelite.errors import HordeliteError
from hordelite.worker._backend import (
    Backend,
    BackendError,
    BackendInfo,
    ByteBound,
    Counter,
    TemplateBound,
    exact_counter,
    measure_bound,
)
from hordelite.worker._reply import reported_counts

log = logging.getLogger("hordelite.worker")

OVERFLOW_REFUSED = ChatGuarantee.prompt_overflow_refused.name
VISION = ChatFeature.vision.name
# How a vision worker takes images: a signed URL it fetches, or inline.
IMAGE_TRANSPORTS = ("url", "base64")
# The probe conversation: short, so that its prompt is mostly the template's
# fixed part; no tools, so it does not measure a tool preamble.
PROBE_MESSAGES: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say OK."},
)


class WorkerError(HordeliteError):
    """The worker cannot run: a backend that proves too little, a horde
    refusing its pops. The message says what to change."""


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What the worker declares on every pop, and why."""

    model_id: str  # declared to the horde
    backend_model: str  # sent to the backend
    backend_kind: str
    context: int
    context_source: str
    max_length: int
    features: tuple[str, ...]  # capabilities and guarantees, vocabulary order
    tools_max_temperature: float | None
    image_transports: tuple[str, ...]  # empty unless the backend reads images
    fit: str  # what the fit check counts with
    guarantee: str  # why prompt_overflow_refused is declared or withheld

    def chat_fields(self, withdrawn: Collection[str] = ()) -> dict[str, Any]:
        """The five chat fields of a pop body (less the withdrawn features)."""
        features = [f for f in self.features if f not in withdrawn]
        limits: dict[str, Any] = {"max_context_length": self.context, "max_length": self.max_length}
        if self.tools_max_temperature is not None:
            limits["tools_max_temperature"] = self.tools_max_temperature
        return {
            "chat_jobs": True,
            "chat_features": features,
            "chat_limits": limits,
            "model_id": self.model_id,
            "image_transports": list(self.image_transports) if VISION in features else [],
        }


async def declare(
    backend: Backend, settings: WorkerConfig
) -> tuple[Declaration, Counter, TemplateBound | None]:
    """Probe the backend: the declaration, the counter the fit check uses
    and the bound that spares it (None: every conversation is counted).

    Raises BackendError when the backend fails, WorkerError when it proves
    too little to run on (no context size and no ``context`` setting).
    """
    info = await backend.discover(settings.model_id)
    context = _context(info, settings)
    if settings.max_length > context:
        raise WorkerError(
            f"max_length {settings.max_length} does not fit the context of {context} tokens"
        )
    usage = await probe_prompt_tokens(backend, info.model)
    counter, backed, why = await _fit_check(backend, info, settings, usage)
    bound = await _bound(counter) if backed and not isinstance(counter, ByteBound) else None
    names = [
        *settings.feature_names,
        *([OVERFLOW_REFUSED] if backed else []),
        *([VISION] if info.vision else []),
    ]
    temperature = settings.tools_max_temperature
    declaration = Declaration(
        model_id=declared_model_id(settings.model_id, info.model),
        backend_model=info.model,
        backend_kind=info.kind,
        context=context,
        context_source="the context setting" if settings.context else info.context_source,
        max_length=settings.max_length,
        features=tuple(known_features(names)),
        tools_max_temperature=temperature if temperature >= 0 else None,
        image_transports=IMAGE_TRANSPORTS if info.vision else (),
        fit=counter.name
        + (f", when {bound.name} does not clear the conversation" if bound else ""),
        guarantee=why,
    )
    _log_declaration(declaration)
    return declaration, counter, bound


def declared_model_id(configured: str, backend_model: str) -> str:
    """The configured id, else the backend's; a llama.cpp model path is
    shortened to the file's name without ``.gguf``."""
    if configured:
        return configured
    name = backend_model
    if name.lower().endswith(".gguf") and ("/" in name or "\\" in name):
        name = posixpath.basename(name.replace("\\", "/"))[: -len(".gguf")]
    return name[:MAX_NAME]


def _context(info: BackendInfo, settings: WorkerConfig) -> int:
    if settings.context:
        if info.context and settings.context > info.context:
            log.warning(
                "context %d is more than the %d tokens the backend reports (%s): "
                "conversations that fit the declaration can overflow the backend",
                settings.context,
                info.context,
                info.context_source,
            )
        return settings.context
    if info.context is None:
        raise WorkerError(
            f"the backend ({info.kind}) does not report its context size; "
            "set it with --context N (worker.context)"
        )
    if info.kind == "ollama" and not info.context_source.startswith("/api"):
        log.warning(
            "Ollama does not report the context it runs with; declaring %d tokens, its "
            "smallest default. Set --context to what `ollama ps` shows to declare more",
            info.context,
        )
    return info.context


async def probe_prompt_tokens(backend: Backend, model: str) -> int | None:
    """The backend's ``usage.prompt_tokens`` for the probe conversation
    (one token generated), None when it does not report it."""
    answer = await backend.chat(
        {"model": model, "messages": list(PROBE_MESSAGES), "max_tokens": 1, "temperature": 0}
    )
    usage = answer.get("usage") if isinstance(answer, dict) else None
    return reported_counts(usage).get("prompt_tokens")


async def _bound(counter: Counter) -> TemplateBound | None:
    """The cheap bound measured with an exact counter that backs the
    guarantee (one not shown to count at least what the backend generates
    from would measure too little); None when the counter fails on the
    probes or the bound falls short of its check."""
    try:
        return await measure_bound(counter)
    except BackendError as exc:
        if exc.down and exc.status is None:
            raise
        log.info("the template overheads cannot be measured (%s): counting every job", exc)
        return None


async def _fit_check(
    backend: Backend, info: BackendInfo, settings: WorkerConfig, usage: int | None
) -> tuple[Counter, bool, str]:
    """(the counter, whether it backs the guarantee, why)."""
    exact = exact_counter(backend, info)
    counted = None
    if exact is not None:
        try:
            counted = await exact.count({"messages": list(PROBE_MESSAGES)})
        except BackendError as exc:
            if exc.down and exc.status is None:
                raise
            log.info("the backend's counter (%s) does not answer: %s", exact.name, exc)
            exact = None
    if exact is not None and counted is not None:
        return _exact_backing(exact, counted, usage)
    if usage is None:
        why = (
            "withheld: the backend has no counter route and reports no usage.prompt_tokens "
            "to measure its template overhead with"
        )
        return ByteBound(0), False, why
    bound = ByteBound(usage)
    if "tools" in settings.feature_names and settings.template_overhead == 0:
        why = (
            "withheld: the byte-length bound cannot see a tools request's tool preamble; "
            "set --template-overhead to its size in tokens to declare it"
        )
        return bound, False, why
    why = f"declared: backed by the byte-length bound plus {usage} tokens measured on the probe"
    if settings.template_overhead:
        why += f", and {settings.template_overhead} more for a tools request"
    return bound, True, why


def _exact_backing(exact: Counter, counted: int, usage: int | None) -> tuple[Counter, bool, str]:
    if usage is None:
        why = (
            f"withheld: the backend reports no usage.prompt_tokens, so {exact.name} "
            "cannot be shown not to undercount"
        )
        return exact, False, why
    if counted < usage:
        why = (
            f"withheld: {exact.name} counts {counted} tokens for the probe conversation, "
            f"{usage - counted} fewer than the backend's usage.prompt_tokens ({usage}): "
            "it renders or tokenizes differently from generation"
        )
        return exact, False, why
    why = (
        f"declared: backed by {exact.name}, which counts {counted} tokens for the probe "
        f"conversation against the backend's {usage}"
    )
    return exact, True, why


def _log_declaration(d: Declaration) -> None:
    log.info(
        "backend %s: model %r (declared as %r), context %d (%s), max_length %d",
        d.backend_kind,
        d.backend_model,
        d.model_id,
        d.context,
        d.context_source,
        d.max_length,
    )
    log.info("declaring chat features: %s", ", ".join(d.features) or "none")
    if d.image_transports:
        log.info("the backend reads images: taking them by %s", ", ".join(d.image_transports))
    log.info("fit check: %s; prompt_overflow_refused %s", d.fit, d.guarantee)
    if ":" in d.model_id:
        log.warning(
            "the model id %r holds a colon: the OpenAI-compatible front cannot reach it; "
            "choose another with --model-id",
            d.model_id,
        )
