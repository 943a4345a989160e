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
    outside models, prompt_jobs false without chat_jobs.
    """
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
    if not chat_jobs:
        return None, prompt_jobs
    model_id = body.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise _refuse("model_id", "is required with chat_jobs: the chat model's name")
    if len(model_id) > MAX_NAME:
        raise _refuse("model_id", f"is longer than {MAX_NAME} characters")
    if model_id not in models:
        raise _refuse("model_id", f"{model_id!r} must be one of models")
    raw_limits = body.get("chat_limits")
    if not isinstance(raw_limits, Mapping):
        raise _refuse(
            "chat_limits",
            "is required with chat_jobs: an object with max_context_length and max_length",
        )
    temperature = raw_limits.get("tools_max_temperature")
    if temperature is not None:
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not math.isfinite(temperature)
            or temperature < 0
        ):
            raise _refuse("chat_limits.tools_max_temperature", "must be a number of at least 0")
        temperature = float(temperature)
    limits = ChatWorkerLimits(
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
    features = body.get("chat_features") or []
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise _refuse("chat_features", "must be an array of feature names")
    transports = body.get("image_transports") or []
    if not isinstance(transports, list) or not all(isinstance(t, str) for t in transports):
        raise _refuse("image_transports", "must be an array of transport names")
    declaration = ChatDeclaration(
        model_id=model_id,
        features=tuple(known_features(features)),
        limits=limits,
        image_transports=tuple(t for t in IMAGE_TRANSPORTS if t in transports),
    )
    return declaration, prompt_jobs
