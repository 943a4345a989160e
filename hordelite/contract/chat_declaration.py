"""The chat declaration a worker sends on every text pop (worker guide, step 1)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from hordelite.contract.chat_features import (
    ChatWorkerLimits,
    known_features,
    to_mask,
    transport_mask,
)
from hordelite.contract.limits import MAX_CONTEXT_LENGTH, MAX_MAX_LENGTH, MAX_NAME
from hordelite.errors import RC, HordeError

IMAGE_TRANSPORTS = ("url", "base64", "messages_url")


@dataclasses.dataclass(frozen=True)
class ChatDeclaration:
    model_id: str
    features: tuple[str, ...]  # known names only, in vocabulary order
    limits: ChatWorkerLimits
    image_transports: tuple[str, ...]

    @property
    def mask(self) -> int:
        """The declared bits. Vision counts only with a transport that can
        carry an image (url or base64): a request with images needs both."""
        names = set(self.features)
        if not {"url", "base64"} & set(self.image_transports):
            names.discard("vision")
        if "vision" not in names:
            return to_mask(names)
        return to_mask(names) | transport_mask(self.image_transports)

    def to_json(self) -> dict[str, Any]:
        limits: dict[str, Any] = {
            "max_context_length": self.limits.max_context_length,
            "max_length": self.limits.max_length,
        }
        if self.limits.tools_max_temperature is not None:
            limits["tools_max_temperature"] = self.limits.tools_max_temperature
        return {
            "model_id": self.model_id,
            "features": list(self.features),
            "limits": limits,
            "image_transports": list(self.image_transports),
        }


def _refuse(field: str, why: str) -> HordeError:
    return HordeError(RC.ChatDeclarationInvalid, f"{field}: {why}", errors={field: why})


def _positive_int(value: Any, field: str, hi: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        raise _refuse(field, f"must be an integer from 1 to {hi}")
    return value


def parse_chat_declaration(
    body: Mapping[str, Any], models: tuple[str, ...]
) -> tuple[ChatDeclaration | None, bool]:
    """(the chat declaration or None, prompt_jobs) of a pop body.

    Raises 400 ChatDeclarationInvalid naming the field: chat_jobs without
    chat_limits or model_id, a negative tools_max_temperature, a model_id
    outside models, prompt_jobs false without chat_jobs. The fields are
    judged in the order below, so the first one wrong is the one named.
    """
    chat_jobs, prompt_jobs = _job_kinds(body)
    if not chat_jobs:
        return None, prompt_jobs
    model_id = _model_id(body, models)
    limits = _chat_limits(body)
    features = _names(body, "chat_features", "must be an array of feature names")
    transports = _names(body, "image_transports", "must be an array of transport names")
    declaration = ChatDeclaration(
        model_id=model_id,
        features=tuple(known_features(features)),
        limits=limits,
        image_transports=tuple(t for t in IMAGE_TRANSPORTS if t in transports),
    )
    return declaration, prompt_jobs


def _job_kinds(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(chat_jobs, prompt_jobs); null reads as the default (false, true)."""
    chat_jobs = body.get("chat_jobs", False)
    prompt_jobs = body.get("prompt_jobs", True)
    if chat_jobs is None:
        chat_jobs = False
    if prompt_jobs is None:
        prompt_jobs = True
    if not isinstance(chat_jobs, bool):
        raise _refuse("chat_jobs", "must be true or false")
    if not isinstance(prompt_jobs, bool):
        raise _refuse("prompt_jobs", "must be true or false")
    if not prompt_jobs and not chat_jobs:
        raise _refuse("prompt_jobs", "false needs chat_jobs true: a worker must serve some jobs")
    return chat_jobs, prompt_jobs


def _model_id(body: Mapping[str, Any], models: tuple[str, ...]) -> str:
    model_id = body.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise _refuse("model_id", "is required with chat_jobs: the chat model's name")
    if len(model_id) > MAX_NAME:
        raise _refuse("model_id", f"is longer than {MAX_NAME} characters")
    if model_id not in models:
        raise _refuse("model_id", f"{model_id!r} must be one of models")
    return model_id


def _chat_limits(body: Mapping[str, Any]) -> ChatWorkerLimits:
    raw_limits = body.get("chat_limits")
    if not isinstance(raw_limits, Mapping):
        raise _refuse(
            "chat_limits",
            "is required with chat_jobs: an object with max_context_length and max_length",
        )
    temperature = _tools_max_temperature(raw_limits.get("tools_max_temperature"))
    return ChatWorkerLimits(
        max_context_length=_positive_int(
            raw_limits.get("max_context_length"),
            "chat_limits.max_context_length",
            MAX_CONTEXT_LENGTH,
        ),
        max_length=_positive_int(
            raw_limits.get("max_length"), "chat_limits.max_length", MAX_MAX_LENGTH
        ),
        tools_max_temperature=temperature,
    )


def _tools_max_temperature(value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise _refuse("chat_limits.tools_max_temperature", "must be a number of at least 0")
    return float(value)


def _names(body: Mapping[str, Any], field: str, why: str) -> list[str]:
    """An optional array of strings (absent, null or empty: none)."""
    names = body.get(field) or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _refuse(field, why)
    return names
