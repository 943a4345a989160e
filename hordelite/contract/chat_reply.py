"""The chat reply contract: the structured submit, its checks, the job payload.

Pure functions, no I/O (worker guide steps 2, 4, 6 and 7; the conformance decision):

- ``is_chat_submit(body)`` tells a chat submit from a text submit;
- ``parse_chat_submit(body)`` checks the submit's structure and refuses a body
  that cannot be stored as an OpenAI choice (400 ChatSubmitInvalid naming the
  field);
- ``verify_chat_reply(req, reply)`` checks what the reply proves against the
  stored request (400 ChatSubmitInvalid under both conformance modes, 400
  ChatSubmitNonconformant under strict) and returns the reply as stored;
  ``judge_chat_reply`` adds the model check and keeps the outcome, so that
  the horde can judge a reply before its write transaction;
- ``output_estimate_chars(reply)`` is what the charge and the reward price;
- ``build_worker_chat_extras(...)`` is the chat job payload, narrowed as the
  contract allows.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any, Final

import referencing
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from hordelite.contract._fields import kind_name, parse_uuid
from hordelite.contract.chat_request import NEUTRAL_BACKEND_SAMPLERS, ChatRequest
from hordelite.contract.limits import (
    MAX_ID_CHARS,
    MAX_NAME,
    MAX_NATIVE_FINISH_REASON,
    MAX_REASONING_BYTES,
    MAX_REPORTED_TOKENS,
)
from hordelite.errors import RC, HordeError

FINISH_REASONS = ("stop", "length", "content_filter", "tool_calls")
SUBMIT_STATES = ("ok", "censored", "csam", "faulted")
TOKEN_COUNTS = ("prompt_tokens", "completion_tokens", "reasoning_tokens")


class FaultReason:
    """The ``fault_reason`` values of a faulted chat submit, named once for
    the worker that sends them and the horde that reads them (the values are
    the wire's)."""

    PROMPT_OVERFLOW: Final = "prompt_overflow"
    REPLY_REFUSED: Final = "reply_refused"
    TEMPLATE_ERROR: Final = "template_error"
    BACKEND_ERROR: Final = "backend_error"
    UNSUPPORTED_INPUT: Final = "unsupported_input"


# The horde stores and reports a fixed sentence per reason (rc ChatWorkerFault);
# the worker never supplies the text (worker guide, step 7).
FAULT_REASONS: dict[str, str] = {
    FaultReason.PROMPT_OVERFLOW: (
        "The conversation does not fit the worker's context: its rendered prompt "
        "plus the reply's max_length exceed the worker's max_context_length."
    ),
    FaultReason.REPLY_REFUSED: "The horde refused the worker's reply to this request.",
    FaultReason.TEMPLATE_ERROR: "The worker's chat template could not render this conversation.",
    FaultReason.BACKEND_ERROR: "The worker's backend failed while generating the reply.",
    FaultReason.UNSUPPORTED_INPUT: "The worker could not process an input of this request.",
}

# A refusal quotes at most this much of a validator's message, which can
# repeat the whole offending value.
_MAX_DETAIL = 300


@dataclasses.dataclass(frozen=True)
class ChatReply:
    """A worker's assistant message with its finish reason and reported counts.

    The counts are the worker's claims: shown, never priced.
    """

    content: str | None
    tool_calls: list[dict[str, Any]] | None
    reasoning_content: str | None
    finish_reason: str
    native_finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None

    def message(self) -> dict[str, Any]:
        """The OpenAI assistant message the client receives."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        return out

    def to_json(self) -> dict[str, Any]:
        """The stored form; ``from_json`` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChatReply:
        fields: dict[str, Any] = {f.name: data.get(f.name) for f in dataclasses.fields(cls)}
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class ChatSubmit:
    """A parsed chat submit. ``reply`` is None exactly when the job faulted."""

    id: str
    state: str
    model_id: str | None
    reply: ChatReply | None
    fault_reason: str | None


def answer_kind(sub: object) -> str:
    """A submit's kind of answer, as submit_refusal takes it: "chat" for a
    parsed chat submit, "text" for a generation or a text-shaped fault."""
    return "chat" if isinstance(sub, ChatSubmit) else "text"


# Errors ----------------------------------------------------------------------


def submit_invalid(field: str, why: str) -> HordeError:
    """400 ChatSubmitInvalid naming the field, with the ``errors`` map."""
    return HordeError(RC.ChatSubmitInvalid, f"{field}: {why}", errors={field: why})


def nonconformant(field: str, why: str) -> HordeError:
    """400 ChatSubmitNonconformant: the reply breaks what a strict request asked."""
    return HordeError(RC.ChatSubmitNonconformant, f"{field}: {why}", errors={field: why})


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."


# Parsing the submit ----------------------------------------------------------------


def is_chat_submit(body: Mapping[str, Any]) -> bool:
    """A body with model_id or message is a chat submit (the worker guide: model_id marks
    the body as a chat submit, which then does not need generation)."""
    return isinstance(body, Mapping) and ("model_id" in body or "message" in body)


def parse_chat_submit(body: Any) -> ChatSubmit:
    """Check a chat submit's structure.

    Returns the submit; its reply is None for a faulted job. Raises 404
    InvalidJobID for an id that is not a UUID and 400 ChatSubmitInvalid naming
    the field for anything that cannot be stored as an OpenAI choice. A
    fault_reason the horde does not know is ignored.
    """
    if not isinstance(body, Mapping):
        raise submit_invalid("body", f"expected a JSON object, got {kind_name(body)}")
    job_id = _parse_id(body)
    state = _parse_state(body)
    model_id = _parse_model_id(body)
    if "generation" in body and "message" in body:
        raise submit_invalid(
            "message", "send either message (a chat job) or generation (a text job), not both"
        )
    if state == "faulted":
        reason = body.get("fault_reason")
        known = reason if isinstance(reason, str) and reason in FAULT_REASONS else None
        return ChatSubmit(id=job_id, state=state, model_id=model_id, reply=None, fault_reason=known)
    return ChatSubmit(
        id=job_id, state=state, model_id=model_id, reply=_parse_reply(body), fault_reason=None
    )


def _parse_id(body: Mapping[str, Any]) -> str:
    raw = body.get("id")
    if raw is None:
        raise submit_invalid("id", "is required")
    job_id = parse_uuid(raw)
    if job_id is None:
        raise HordeError(RC.InvalidJobID, f"id {str(raw)[:MAX_ID_CHARS]!r} is not a job id.")
    return job_id


def _parse_state(body: Mapping[str, Any]) -> str:
    # As for text jobs, a submit without a state means ok.
    state = body.get("state")
    if state is None:
        return "ok"
    if state not in SUBMIT_STATES:
        raise submit_invalid("state", f"must be one of {', '.join(SUBMIT_STATES)}")
    return str(state)


def _parse_model_id(body: Mapping[str, Any]) -> str | None:
    model_id = body.get("model_id")
    if model_id is None:
        return None
    if not isinstance(model_id, str) or not model_id or len(model_id) > MAX_NAME:
        raise submit_invalid("model_id", f"must be a model name of 1 to {MAX_NAME} characters")
    return model_id


def _parse_reply(body: Mapping[str, Any]) -> ChatReply:
    message = body.get("message")
    if not isinstance(message, Mapping):
        why = "is required: the assistant message, sent in place of generation"
        raise submit_invalid(
            "message", why if message is None else f"expected an object, got {kind_name(message)}"
        )
    if message.get("role") != "assistant":
        raise submit_invalid(
            "message.role", f"must be 'assistant', got {message.get('role')!r:.40}"
        )
    calls = _parse_tool_calls(message.get("tool_calls"))
    content = message.get("content")
    if content is None and not calls:
        raise submit_invalid(
            "message.content", "may be null only when message.tool_calls holds calls"
        )
    if content is not None and not isinstance(content, str):
        raise submit_invalid(
            "message.content", f"expected a string or null, got {kind_name(content)}"
        )
    finish_reason = _parse_finish_reason(body, calls)
    return ChatReply(
        content=content,
        tool_calls=calls or None,
        reasoning_content=_parse_reasoning(message.get("reasoning_content")),
        finish_reason=finish_reason,
        native_finish_reason=_parse_native_finish_reason(body.get("native_finish_reason")),
        prompt_tokens=_parse_count(body, "prompt_tokens"),
        completion_tokens=_parse_count(body, "completion_tokens"),
        reasoning_tokens=_parse_count(body, "reasoning_tokens"),
    )


def _parse_tool_calls(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise submit_invalid("message.tool_calls", f"expected an array, got {kind_name(value)}")
    return [_parse_tool_call(call, f"message.tool_calls[{i}]") for i, call in enumerate(value)]


def _parse_tool_call(call: Any, at: str) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise submit_invalid(at, f"expected an object, got {kind_name(call)}")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise submit_invalid(f"{at}.id", "is required: the call id the backend minted")
    if call.get("type") != "function":
        raise submit_invalid(f"{at}.type", "must be 'function'")
    function = call.get("function")
    if not isinstance(function, Mapping):
        raise submit_invalid(f"{at}.function", "is required: an object with name and arguments")
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        raise submit_invalid(f"{at}.function.name", "is required: the called function's name")
    if not isinstance(arguments, str):
        raise submit_invalid(
            f"{at}.function.arguments", f"expected a string, got {kind_name(arguments)}"
        )
    # Unknown keys of a call are dropped, as in a request's tool history.
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _parse_reasoning(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise submit_invalid(
            "message.reasoning_content", f"expected a string, got {kind_name(value)}"
        )
    if len(value.encode("utf-8", "surrogatepass")) > MAX_REASONING_BYTES:
        raise submit_invalid(
            "message.reasoning_content", f"is larger than {MAX_REASONING_BYTES} bytes of UTF-8"
        )
    # An empty reasoning is no reasoning: the field is left out when shown.
    return value or None


def _parse_finish_reason(body: Mapping[str, Any], calls: list[dict[str, Any]]) -> str:
    reason = body.get("finish_reason")
    if reason not in FINISH_REASONS:
        raise submit_invalid("finish_reason", f"must be one of {', '.join(FINISH_REASONS)}")
    if reason == "tool_calls" and not calls:
        raise submit_invalid("finish_reason", "is tool_calls, but message.tool_calls holds no call")
    return str(reason)


def _parse_native_finish_reason(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise submit_invalid("native_finish_reason", f"expected a string, got {kind_name(value)}")
    if len(value) > MAX_NATIVE_FINISH_REASON:
        raise submit_invalid(
            "native_finish_reason", f"is longer than {MAX_NATIVE_FINISH_REASON} characters"
        )
    return value


def _parse_count(body: Mapping[str, Any], key: str) -> int | None:
    # A missing count stays missing (null), a reported zero is kept (worker guide, step 6).
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type: 21.0 is 21
    if isinstance(value, bool) or not isinstance(value, int):
        raise submit_invalid(key, f"expected an integer, got {kind_name(value)}")
    if not 0 <= value <= MAX_REPORTED_TOKENS:
        raise submit_invalid(key, f"{_clip(str(value))} is outside 0 to {MAX_REPORTED_TOKENS:,}")
    return value


# Verifying the reply against the request ----------------------------------------------

# A reply with more text than this (content and reasoning, in characters) is
# judged in a worker thread: parsing and validating it takes long enough to
# hold up the event loop.
HEAVY_REPLY_CHARS = 32_768


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A chat reply judged against its job: the reply as stored, or the
    refusal. ``job_id`` and ``model`` say what it was judged against."""

    job_id: str
    model: str
    reply: ChatReply | None
    refusal: HordeError | None


def judge_chat_reply(job_id: str, model: str, req: ChatRequest, sub: ChatSubmit) -> Verdict:
    """The model check, then ``verify_chat_reply``: the verdict on a reply to
    the job ``job_id`` of ``model`` for the stored request ``req``."""
    assert sub.reply is not None
    try:
        if sub.model_id != model:
            raise HordeError(
                RC.ChatModelMismatch,
                f"model_id {sub.model_id!r} is not the model this job was assigned: {model!r}.",
            )
        return Verdict(job_id, model, verify_chat_reply(req, sub.reply), None)
    except HordeError as refusal:
        return Verdict(job_id, model, None, refusal)


def heavy_to_judge(reply: ChatReply) -> bool:
    """Whether judging the reply may take long enough to hold up the event
    loop: a long reply (parsing it and validating it against a schema grow
    with its length). A short reply is judged on the loop: a thread hop per
    structured reply cost more than the judging (and a thread would not help
    against a costly pattern in a client's schema: ``re`` holds the GIL)."""
    return len(reply.content or "") + len(reply.reasoning_content or "") > HEAVY_REPLY_CHARS


def verify_chat_reply(req: ChatRequest, reply: ChatReply) -> ChatReply:
    """Check what the reply proves against the stored request (the conformance decision).

    Returns the reply as stored and shown: under strict with
    parallel_tool_calls false only its first call, and finish_reason stop for
    a reply to a named function. Raises 400 ChatSubmitInvalid for a call the
    client cannot dispatch or answer (both modes), then, under strict only,
    400 ChatSubmitNonconformant for a reply its tool_choice or response_format
    rules out. Every call submitted is checked, including those a single-call
    request then drops: the checks cover the payload as the worker sent it.
    """
    calls = reply.tool_calls or []
    _check_calls_are_usable(req, calls)
    if req.horde.strict:
        _check_tool_choice(req, calls)
        _check_format(req, reply)
        if not req.parallel_tool_calls and len(calls) > 1:
            reply = dataclasses.replace(reply, tool_calls=calls[:1])
    if req.named_function is not None and reply.finish_reason == "tool_calls":
        # OpenAI finishes a forced function call with stop.
        reply = dataclasses.replace(reply, finish_reason="stop")
    return reply


def _check_calls_are_usable(req: ChatRequest, calls: list[dict[str, Any]]) -> None:
    offered = [tool["function"]["name"] for tool in req.tools or ()]
    seen: dict[str, int] = {}
    for i, call in enumerate(calls):
        name, call_id = call["function"]["name"], call["id"]
        if name not in offered:
            listing = ", ".join(repr(n) for n in offered) if offered else "none"
            raise submit_invalid(
                f"message.tool_calls[{i}].function.name",
                f"the reply calls {name!r:.80}, which is not a function of the request's tools "
                f"(offered: {listing})",
            )
        if call_id in seen:
            raise submit_invalid(
                f"message.tool_calls[{i}].id",
                f"the id {call_id!r:.80} is already the id of message.tool_calls[{seen[call_id]}]; "
                "each call needs its own id",
            )
        seen[call_id] = i


def _check_tool_choice(req: ChatRequest, calls: list[dict[str, Any]]) -> None:
    choice, named = req.tool_choice, req.named_function
    if choice == "none" and calls:
        raise nonconformant(
            "message.tool_calls",
            f"the request's tool_choice is 'none', but the reply calls "
            f"{calls[0]['function']['name']!r:.80}",
        )
    if (choice == "required" or named is not None) and not calls:
        forced = f"the function {named!r}" if named is not None else "'required'"
        raise nonconformant(
            "message.tool_calls",
            f"the request's tool_choice is {forced}, but the reply calls no tool",
        )
    for i, call in enumerate(calls):
        if named is not None and call["function"]["name"] != named:
            raise nonconformant(
                f"message.tool_calls[{i}].function.name",
                f"the reply calls {call['function']['name']!r:.80}, but the request's tool_choice "
                f"names the function {named!r}",
            )


def _check_format(req: ChatRequest, reply: ChatReply) -> None:
    fmt = req.response_format
    if fmt is None:
        return
    if reply.tool_calls and not reply.content:
        return  # a reply that only calls tools has no answer to format
    content = reply.content or ""
    spec = fmt.get("json_schema", {})
    label = "json_object" if fmt["type"] == "json_object" else f"json_schema {spec.get('name')!r}"
    instance = _load_json(content, label)
    if fmt["type"] == "json_schema" and spec.get("strict"):
        if _check_schema(instance, spec.get("schema", {}), label):
            return
    if not isinstance(instance, dict):
        raise nonconformant(
            "message.content",
            f"the request's response_format is {label}, but the content is {kind_name(instance)}, not a JSON object",
        )


def _load_json(content: str, label: str) -> Any:
    try:
        return json.loads(content, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise nonconformant(
            "message.content",
            f"the request's response_format is {label}, but the content is not JSON: {_clip(str(exc))}",
        ) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    """A validator per distinct schema, checked against the metaschema once:
    that check costs about a millisecond, the validation itself far less."""
    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=referencing.Registry())


def _check_schema(instance: Any, schema: Any, label: str) -> bool:
    """Validate against a strict schema (Draft 2020-12; ``format`` is an
    annotation, as the draft's default vocabulary says).

    Returns True when the schema was applied and the content matches; raises
    ChatSubmitNonconformant naming the instance and schema paths when it does
    not. Returns False when the validator cannot apply the client's schema
    (invalid against the metaschema, an unresolvable or remote $ref, a
    self-referencing $ref, a bad regex): the schema then proves nothing about
    the reply, and refusing would fault every worker for the client's mistake,
    so the caller falls back to the non-strict rule (a JSON object). Remote
    references are never fetched (an empty registry): verification does no I/O.
    """
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
        error: ValidationError | None = best_match(validator.iter_errors(instance))
    except Exception:
        # SchemaError, Unresolvable, RecursionError, re.error...: the
        # validator meets a client-controlled schema, and whatever it raises
        # means the schema cannot be applied, not that the reply is wrong.
        return False
    if error is None:
        return True
    path = "/".join(str(p) for p in error.absolute_schema_path) or "(root)"
    raise nonconformant(
        "message.content",
        f"the content does not match the request's strict {label}: at {error.json_path}: "
        f"{_clip(error.message)} (schema path: {path})",
    )


# Pricing -----------------------------------------------------------------------


def output_estimate_chars(reply: ChatReply) -> int:
    """The characters the charge and reward price (chat guide, "Pricing by the text
    output estimate"): content, reasoning, and each call's name and arguments.
    ``hordelite.contract.kudos.billed_tokens`` turns them into tokens."""
    chars = len(reply.content or "") + len(reply.reasoning_content or "")
    for call in reply.tool_calls or ():
        chars += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return chars


# The worker's payload -----------------------------------------------------------


def build_worker_chat_extras(
    req: ChatRequest,
    declared: frozenset[str],
    max_length: int,
    max_context_length: int,
    *,
    stream_progress: bool = False,
) -> dict[str, Any]:
    """The chat job payload a worker receives (worker guide, step 2).

    Every sampling field is present, OpenAI's defaults where the client left
    one out and the backend-only samplers neutral, so a request means the same
    on every worker. ``max_length`` and ``max_context_length`` are the budgets
    already validated against the worker's limits. Tools are narrowed as the conformance decision
    0036 allows; the stored request keeps the client's values.
    """
    payload: dict[str, Any] = {
        "messages": copy.deepcopy(req.messages),
        **req.sampling,
        **NEUTRAL_BACKEND_SAMPLERS,
        "max_length": max_length,
        "max_context_length": max_context_length,
        "n": 1,
    }
    if req.stop:
        payload["stop_sequence"] = list(req.stop)
    if req.seed is not None:
        payload["seed"] = req.seed
    if "reasoning_effort" in declared:
        # A declaring backend gets OpenAI's default, not its own unlimited one.
        payload["reasoning_effort"] = req.reasoning_effort or "medium"
    payload.update(_worker_tools(req))
    if req.response_format is not None:
        payload["response_format"] = copy.deepcopy(req.response_format)
    if stream_progress:
        payload["stream_progress"] = True
    return payload


def _worker_tools(req: ChatRequest) -> dict[str, Any]:
    """tools, tool_choice and parallel_tool_calls as the worker receives them."""
    if not req.forwards_tools:
        return {}  # no tools, or tool_choice none: no tool key at all
    tools = copy.deepcopy(req.tools or [])
    out: dict[str, Any] = {}
    named = req.named_function
    if named is not None:
        out["tools"] = [t for t in tools if t["function"]["name"] == named]
        out["tool_choice"] = "required"
    else:
        out["tools"] = tools
        if req.tool_choice is not None:
            out["tool_choice"] = req.tool_choice
    if not req.parallel_tool_calls:
        # true is the default and changes nothing; false changes the answer.
        out["parallel_tool_calls"] = False
    return out
