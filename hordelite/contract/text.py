"""The native text request, pop and submit bodies: validation, no I/O.

Each ``parse_*`` function takes the decoded JSON body and returns a frozen
value, or raises a HordeError naming the field. Unknown keys are ignored, as
the AI Horde ignores them, so that every existing client and worker keeps
working; only known sampling parameters are forwarded to workers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hordelite.contract import _fields as f
from hordelite.contract.budgets import over_models_cap
from hordelite.contract.chat_declaration import ChatDeclaration, parse_chat_declaration
from hordelite.contract.eligibility import RequestView
from hordelite.contract.generations import MAX_GENERATION_CHARS
from hordelite.contract.limits import (
    DEFAULT_MAX_CONTEXT_LENGTH,
    DEFAULT_MAX_LENGTH,
    MAX_AGENT_CHARS,
    MAX_CONTEXT_LENGTH,
    MAX_GEN_METADATA,
    MAX_GEN_METADATA_CHARS,
    MAX_GEN_METADATA_REF_CHARS,
    MAX_ID_CHARS,
    MAX_MAX_LENGTH,
    MAX_MODELS,
    MAX_NAME,
    MAX_PAGE,
    MAX_POP_THREADS,
    MAX_PRIORITY_USERNAMES,
    MAX_REQUEST_N,
    MAX_SEED,
    MAX_STATE_CHARS,
    MAX_STATUS_WAIT,
    MAX_STOP_SEQUENCE_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_WEBHOOK_CHARS,
    MAX_WORKER_IDS,
    MIN_CONTEXT_LENGTH,
    MIN_MAX_LENGTH,
    MIN_SAMPLER_ORDER,
    MIN_SEED,
)
from hordelite.contract.unicode_rules import worker_name_key
from hordelite.errors import RC, HordeError, bad_request

# Sampling parameters with their bounds, as the AI Horde's ModelPayloadKobold.
SAMPLING_NUMBERS: dict[str, tuple[float, float]] = {
    "temperature": (0, 5),
    "top_p": (0.001, 1),
    "top_a": (0, 1),
    "typical": (0, 1),
    "tfs": (0, 1),
    "min_p": (0, 1),
    "rep_pen": (1, 3),
    "rep_pen_slope": (0, 10),
    "smoothing_factor": (0, 10),
    "dynatemp_range": (0, 5),
    "dynatemp_exponent": (0, 5),
}
SAMPLING_INTS: dict[str, tuple[int, int]] = {
    "top_k": (0, 200),
    "rep_pen_range": (0, 4096),
}
SAMPLING_BOOLS = (
    "use_default_badwordsids",
    "singleline",
    "frmtadsnsp",
    "frmtrmblln",
    "frmtrmspch",
    "frmttriminc",
)


@dataclasses.dataclass(frozen=True)
class TextRequest:
    """A validated ``/generate/text/async`` body."""

    prompt: str
    params: dict[str, Any]  # the sampling fields forwarded to the worker
    n: int
    max_length: int
    max_context_length: int
    models: tuple[str, ...]
    workers: tuple[str, ...]
    worker_blacklist: bool
    trusted_workers: bool
    slow_workers: bool
    nsfw: bool
    softprompt: str | None
    dry_run: bool
    allow_downgrade: bool
    proxied_account: str | None
    webhook: str | None

    def eligibility(self, max_context_length: int | None = None) -> RequestView:
        """What eligibility reads of this request; ``max_context_length``
        in place of its own where the context is still to be chosen (0: any
        worker's, as completion_offers asks)."""
        return RequestView(
            models=self.models,
            max_length=self.max_length,
            max_context_length=(
                self.max_context_length if max_context_length is None else max_context_length
            ),
            trusted_workers=self.trusted_workers,
            slow_workers=self.slow_workers,
            nsfw=self.nsfw,
            worker_ids=self.workers,
            worker_blacklist=self.worker_blacklist,
        )


def parse_text_request(body: Any, *, http_webhooks: bool = False) -> TextRequest:
    """A native text request, validated. ``http_webhooks``: a plain http://
    webhook is accepted too (``[webhooks] call_private``); otherwise only an
    https:// one is, as the AI Horde accepts."""
    body = f.expect_object(body, "body")
    prompt = body.get("prompt")
    if prompt is None or prompt == "":
        raise HordeError(RC.MissingPrompt)
    if not isinstance(prompt, str):
        raise bad_request("prompt", "expected a string")
    params = _parse_params(body.get("params"))
    workers = f.get_str_list(body, "workers", "workers", MAX_WORKER_IDS, MAX_ID_CHARS)
    canonical: list[str] = []
    for i, worker in enumerate(workers):
        worker_id = f.parse_uuid(worker)
        if worker_id is None:
            raise bad_request(f"workers.{i}", "is not a worker id (a UUID)")
        canonical.append(worker_id)
    webhook = f.get_str(body, "webhook", "webhook", MAX_WEBHOOK_CHARS, None)
    if webhook is not None:
        webhook = _webhook(webhook, http_webhooks)
    return TextRequest(
        prompt=prompt,
        params=params,
        n=params.pop("n"),
        max_length=params["max_length"],
        max_context_length=params["max_context_length"],
        models=tuple(dict.fromkeys(f.get_str_list(body, "models", "models", MAX_MODELS, MAX_NAME))),
        workers=tuple(dict.fromkeys(canonical)),
        worker_blacklist=f.get_bool(body, "worker_blacklist", "worker_blacklist", False),
        trusted_workers=f.get_bool(body, "trusted_workers", "trusted_workers", False),
        slow_workers=f.get_bool(body, "slow_workers", "slow_workers", True),
        nsfw=f.get_bool(body, "nsfw", "nsfw", False),
        softprompt=f.get_str(body, "softprompt", "softprompt", MAX_NAME, None) or None,
        dry_run=f.get_bool(body, "dry_run", "dry_run", False),
        allow_downgrade=f.get_bool(body, "allow_downgrade", "allow_downgrade", False),
        proxied_account=f.get_str(body, "proxied_account", "proxied_account", MAX_NAME, None),
        webhook=webhook,
    )


def _webhook(url: str, http_allowed: bool) -> str:
    """The webhook as given, when it is an absolute URL the horde may call
    (its host is checked again at each call: what it resolves to then)."""
    schemes = ("https://", "http://") if http_allowed else ("https://",)
    if not url.lower().startswith(schemes):
        raise bad_request("webhook", "must be an " + " or ".join(schemes) + " URL")
    rest = url.split("://", 1)[1]
    if not rest or rest[0] in "/?#" or any(c.isspace() for c in url):
        raise bad_request("webhook", "must be a URL with a host and no spaces")
    return url


def _parse_params(raw: Any) -> dict[str, Any]:
    params = f.expect_object({} if raw is None else raw, "params")
    out: dict[str, Any] = {
        "n": f.get_int(params, "n", "params.n", 1, MAX_REQUEST_N, 1),
        "max_length": f.get_int(
            params,
            "max_length",
            "params.max_length",
            MIN_MAX_LENGTH,
            MAX_MAX_LENGTH,
            DEFAULT_MAX_LENGTH,
        ),
        "max_context_length": f.get_int(
            params,
            "max_context_length",
            "params.max_context_length",
            MIN_CONTEXT_LENGTH,
            MAX_CONTEXT_LENGTH,
            DEFAULT_MAX_CONTEXT_LENGTH,
        ),
    }
    if out["max_context_length"] < out["max_length"]:
        raise HordeError(
            RC.TokenOverflow,
            f"params.max_context_length ({out['max_context_length']}) must be at least "
            f"params.max_length ({out['max_length']}).",
        )
    for key, (lo, hi) in SAMPLING_NUMBERS.items():
        if params.get(key) is not None:
            out[key] = f.get_number(params, key, f"params.{key}", lo, hi)
    for key, (ilo, ihi) in SAMPLING_INTS.items():
        if params.get(key) is not None:
            out[key] = f.get_int(params, key, f"params.{key}", ilo, ihi)
    for key in SAMPLING_BOOLS:
        if params.get(key) is not None:
            out[key] = f.get_bool(params, key, f"params.{key}", False)
    if params.get("sampler_order") is not None:
        out["sampler_order"] = _parse_sampler_order(params["sampler_order"])
    if params.get("stop_sequence") is not None:
        out["stop_sequence"] = _parse_stop_sequence(params["stop_sequence"])
    return out


def _parse_sampler_order(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 6 for v in value
    ):
        raise bad_request("params.sampler_order", "expected an array of integers 0 to 6")
    if len(set(value)) < MIN_SAMPLER_ORDER:
        raise bad_request(
            "params.sampler_order", f"must hold at least {MIN_SAMPLER_ORDER} distinct values"
        )
    return list(value)


def _parse_stop_sequence(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise bad_request("params.stop_sequence", "expected an array of strings")
    if len(value) > MAX_STOP_SEQUENCES:
        raise HordeError(
            RC.TooManyStopSequences,
            f"params.stop_sequence has {len(value)} entries; at most {MAX_STOP_SEQUENCES} are allowed.",
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise bad_request(f"params.stop_sequence.{i}", "expected a string")
        if len(item) > MAX_STOP_SEQUENCE_CHARS:
            raise HordeError(
                RC.ExcessiveStopSequence,
                f"params.stop_sequence.{i} is longer than {MAX_STOP_SEQUENCE_CHARS} characters.",
            )
    return list(value)


@dataclasses.dataclass(frozen=True)
class PopRequest:
    """A validated ``/generate/text/pop`` body: what a text worker declares."""

    name: str
    models: tuple[str, ...]
    max_length: int
    max_context_length: int
    nsfw: bool
    threads: int
    amount: int
    bridge_agent: str
    extra_slow_worker: bool
    wait: float  # long-poll seconds; 0 is the AI Horde's immediate answer
    priority_usernames: tuple[str, ...]
    chat: ChatDeclaration | None = None  # absent: the worker takes no chat jobs
    prompt_jobs: bool = True  # false: chat jobs only
    # What worker names are compared by (unicode_rules.worker_name_key),
    # worked out once, at parse.
    name_key: str = ""


def parse_pop_request(body: Any, max_wait: float, models_per_worker: int) -> PopRequest:
    """``models_per_worker``: budgets.models_per_worker, the distinct models
    one pop may declare (0: no limit; MAX_MODELS entries in any case)."""
    body = f.expect_object(body, "body")
    name = f.get_str(body, "name", "name", MAX_NAME).strip()
    if not name:
        raise bad_request("name", "must not be empty")
    models = tuple(dict.fromkeys(f.get_str_list(body, "models", "models", MAX_MODELS, MAX_NAME)))
    if not models:
        raise bad_request("models", "must name at least one model")
    if over_models_cap(len(models), models_per_worker):
        # Distinct names, as stored: a name sent twice is one model served.
        why = f"declares {len(models)} models; a worker may declare at most {models_per_worker}"
        raise HordeError(
            RC.TooManyModels,
            f"models: {why} (budgets.models_per_worker).",
            errors={"models": why},
        )
    chat, prompt_jobs = parse_chat_declaration(body, models)
    return PopRequest(
        name=name,
        models=models,
        max_length=f.get_int(
            body, "max_length", "max_length", 1, MAX_MAX_LENGTH, DEFAULT_MAX_LENGTH
        ),
        max_context_length=f.get_int(
            body,
            "max_context_length",
            "max_context_length",
            1,
            MAX_CONTEXT_LENGTH,
            DEFAULT_MAX_CONTEXT_LENGTH,
        ),
        nsfw=f.get_bool(body, "nsfw", "nsfw", True),
        threads=f.get_int(body, "threads", "threads", 1, MAX_POP_THREADS, 1),
        amount=f.get_int(body, "amount", "amount", 1, MAX_REQUEST_N, 1),
        bridge_agent=f.get_str(
            body, "bridge_agent", "bridge_agent", MAX_AGENT_CHARS, "unknown:0:unknown"
        ),
        extra_slow_worker=f.get_bool(body, "extra_slow_worker", "extra_slow_worker", False),
        wait=float(f.get_number(body, "wait", "wait", 0, max_wait, 0)),
        priority_usernames=tuple(
            f.get_str_list(
                body, "priority_usernames", "priority_usernames", MAX_PRIORITY_USERNAMES, MAX_NAME
            )
        ),
        chat=chat,
        prompt_jobs=prompt_jobs,
        # Last (arguments run in order): a name no worker can have is
        # refused after every other field of the body was checked.
        name_key=worker_name_key(name),
    )


GEN_STATES = ("ok", "censored", "csam", "faulted")


@dataclasses.dataclass(frozen=True)
class JobSubmit:
    """A validated ``/generate/text/submit`` body."""

    id: str
    generation: str
    state: str
    seed: int | None
    gen_metadata: list[dict[str, Any]]


def parse_job_submit(body: Any) -> JobSubmit:
    body = f.expect_object(body, "body")
    raw_id = body.get("id")
    if raw_id is None:
        raise bad_request("id", "is required")
    job_id = f.parse_uuid(raw_id)
    if job_id is None:
        raise HordeError(RC.InvalidJobID, f"id {str(raw_id)[:MAX_ID_CHARS]!r} is not a job id.")
    # The old KoboldAI bridge sends no state: it means ok.
    state = f.get_str(body, "state", "state", MAX_STATE_CHARS, "ok")
    if state not in GEN_STATES:
        raise bad_request("state", f"must be one of {', '.join(GEN_STATES)}")
    if body.get("generation", "") is None and state == "ok":
        # The AI Horde's worker bridge submits a null generation, with no
        # state, when its backend failed every try: the fault it reports
        # (decision 0069).
        state = "faulted"
    if state == "faulted":
        generation = f.get_str(body, "generation", "generation", MAX_GENERATION_CHARS, "") or ""
    else:
        generation = f.get_str(body, "generation", "generation", MAX_GENERATION_CHARS)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        # Bridges send the seed as a number or a numeric string.
        try:
            seed = int(seed)
        except (TypeError, ValueError, OverflowError):
            # OverflowError: an infinite float (1e400 reads as one) has no integer.
            raise bad_request("seed", "expected an integer") from None
    if seed is not None and not MIN_SEED <= seed <= MAX_SEED:
        raise bad_request("seed", "must be a 64-bit integer (-2**63 to 2**63 - 1)")
    return JobSubmit(
        id=job_id,
        generation=generation,
        state=state,
        seed=seed,
        gen_metadata=_parse_gen_metadata(body.get("gen_metadata")),
    )


def _parse_gen_metadata(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_GEN_METADATA:
        raise bad_request(
            "gen_metadata", f"expected an array of at most {MAX_GEN_METADATA} entries"
        )
    out = []
    for i, entry in enumerate(value):
        entry = f.expect_object(entry, f"gen_metadata.{i}")
        item = {
            "type": f.get_str(entry, "type", f"gen_metadata.{i}.type", MAX_GEN_METADATA_CHARS),
            "value": f.get_str(entry, "value", f"gen_metadata.{i}.value", MAX_GEN_METADATA_CHARS),
        }
        ref = f.get_str(entry, "ref", f"gen_metadata.{i}.ref", MAX_GEN_METADATA_REF_CHARS, None)
        if ref is not None:
            item["ref"] = ref
        out.append(item)
    return out


def parse_status_wait(value: str | None) -> float:
    """The ``wait`` of a long-polled status read (``?wait=N``, a hordelite
    extension): seconds, 0 (the default: answer at once) to MAX_STATUS_WAIT."""
    if value is None or value == "":
        return 0.0
    try:
        wait = float(value)
    except ValueError:
        raise bad_request("wait", "expected a number of seconds") from None
    if not 0 <= wait <= MAX_STATUS_WAIT:  # also refuses nan and inf
        raise bad_request("wait", f"expected 0 to {MAX_STATUS_WAIT:g} seconds")
    return wait


def parse_page(value: str | None) -> int:
    """The ``page`` of a listing (``?page=N``, a hordelite extension): 1 (the
    default) to MAX_PAGE, in decimal digits."""
    if value is None or value == "":
        return 1
    # isascii: str.isdigit() also accepts "²", which int() refuses; the
    # length first, so that int() never reads a number of a thousand digits
    # (leading zeros past MAX_PAGE's own digits are refused with it).
    digits = value.isascii() and value.isdigit() and len(value) <= len(str(MAX_PAGE))
    if not digits or not 1 <= int(value) <= MAX_PAGE:
        raise bad_request("page", f"expected a page number, 1 to {MAX_PAGE}")
    return int(value)


def parse_count_bound(name: str, value: str | None) -> int | None:
    """``min_count`` or ``max_count`` of /status/models (threads serving a
    model): None when absent, else 0 to MAX_PAGE in decimal digits."""
    if value is None or value == "":
        return None
    digits = value.isascii() and value.isdigit() and len(value) <= len(str(MAX_PAGE))
    if not digits or int(value) > MAX_PAGE:
        raise bad_request(name, f"expected a number of threads, 0 to {MAX_PAGE}")
    return int(value)
