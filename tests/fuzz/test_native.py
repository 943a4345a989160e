"""Fuzz the native API: valid bodies mutated one field at a time, whole bodies,
ids in paths, and headers, over real HTTP on SQLite and PostgreSQL.

Every case must get an answer in time, no 5xx, JSON, a 4xx with a return code
and a message, a 400 naming the mutated field; and per example, only the
accepted cases may have stored a request or a worker, or moved kudos.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import strategies as st

from tests.fuzz._harness import (
    CHAT_MODEL,
    CORE_FRAGMENTS,
    HORDE_CHAT_OPTIONS,
    IDLE_MODEL,
    STREAM_MODEL,
    TEXT_MODEL,
    Answer,
    Batch,
    Fuzzer,
    Mutation,
    chat_options,
    huge_body,
    pop_body,
    whole_bodies,
)

# Huge and deeply nested values make reports long; hypothesis says so.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

# Examples per test, and the cases (requests) each example sends.
EXAMPLES = 60
PER_EXAMPLE = 5


def text_body() -> dict[str, Any]:
    return {
        "prompt": "Once upon a time",
        "models": [TEXT_MODEL],
        "params": {
            "n": 1,
            "max_length": 80,
            "max_context_length": 1024,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "rep_pen": 1.1,
            "rep_pen_range": 320,
            "singleline": False,
            "sampler_order": [6, 0, 1, 3, 4, 2, 5],
            "stop_sequence": ["\n\n", "###"],
        },
        "workers": [],
        "worker_blacklist": False,
        "trusted_workers": False,
        "slow_workers": True,
        "nsfw": False,
        "softprompt": "",
        "dry_run": False,
        "allow_downgrade": False,
        "proxied_account": "fuzz",
        "webhook": "https://example.org/hook",
    }


def chat_body(model: str = CHAT_MODEL) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Name one colour."}]},
        ],
        "max_tokens": 64,
        **chat_options(),
        "horde": dict(HORDE_CHAT_OPTIONS),
    }


def submit_body(job_id: str) -> dict[str, Any]:
    return {
        "id": job_id,
        "generation": "The end.",
        "state": "ok",
        "seed": 1,
        "gen_metadata": [{"type": "information", "value": "fuzz"}],
    }


def chat_submit_body(job_id: str) -> dict[str, Any]:
    return {
        "id": job_id,
        "model_id": STREAM_MODEL,
        "state": "ok",
        "message": {
            "role": "assistant",
            "content": "One, two, three.",
            "reasoning_content": "Counting.",
        },
        "finish_reason": "stop",
        "native_finish_reason": "stop",
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "reasoning_tokens": 1,
    }


def progress_body(job_id: str) -> dict[str, Any]:
    return {"id": job_id, "seq": 1, "delta": {"content": "One", "reasoning_content": ""}}


def pop() -> dict[str, Any]:
    return pop_body("fuzz-probe", IDLE_MODEL, chat=True)


def worker_body() -> dict[str, Any]:
    # Two changes: a mutation that drops one still asks for the other (an
    # empty edit is 400 NoWorkerModSelected, naming no field).
    return {"maintenance": False, "info": "fuzzed"}


# A job id in a valid shape that no job has: the bodies' mutation paths.
NO_JOB = "00000000-0000-4000-8000-000000000001"


def post(
    fuzzer: Fuzzer, method: str, path: str, key: str, content: bytes, **kwargs: Any
) -> Answer | None:
    return fuzzer.send(
        method,
        path,
        content=content,
        headers={"apikey": key, "Content-Type": "application/json"},
        **kwargs,
    )


BODY_ROUTES: dict[str, tuple[str, str, Any, tuple[int, ...]]] = {
    # name: (method, path, valid body, accepted statuses); the path's
    # {worker} is the maintained worker's id.
    "text": ("POST", "/api/v2/generate/text/async", text_body(), (200, 202)),
    "chat": ("POST", "/api/v2/generate/chat/async", chat_body(), (202,)),
    "pop": ("POST", "/api/v2/generate/text/pop", pop(), (200,)),
    "submit": ("POST", "/api/v2/generate/text/submit", submit_body(NO_JOB), (200,)),
    "progress": ("POST", "/api/v2/generate/text/progress", progress_body(NO_JOB), (200,)),
    "worker": ("PUT", "/api/v2/workers/{worker}", worker_body(), (200,)),
}


def send_to_route(
    fuzzer: Fuzzer,
    batch: Batch,
    name: str,
    content: bytes,
    headers: dict[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    """One case on the body route ``name`` under the key it takes (the
    requester's for text and chat, the workers' owner's for the others),
    ``headers`` added to its own; what it may have stored is noted in
    ``batch``: a request, or a worker's check-in."""
    method, path, _, accepted = BODY_ROUTES[name]
    key = fuzzer.alice if name in ("text", "chat") else fuzzer.bob
    answer = fuzzer.send(
        method,
        path.format(worker=fuzzer.maintained_id),
        content=content,
        headers={"apikey": key, "Content-Type": "application/json", **(headers or {})},
        accepted=accepted,
        **kwargs,
    )
    if name in ("text", "chat"):
        fuzzer.note_request(batch, answer, name)
    if name == "pop" and answer is not None and answer.rc is None:
        batch.accepted_pops += 1


# Valid bodies mutated field by field -------------------------------------------------


def explore_route_fields(fuzzer: Fuzzer, name: str) -> None:
    """The valid body of the route ``name`` mutated field by field, each
    case sent with ``send_to_route``."""
    valid = BODY_ROUTES[name][2]

    def case(batch: Batch, changes: list[Mutation]) -> None:
        for change in changes:
            content, field = change.apply(valid)
            send_to_route(fuzzer, batch, name, content, field=field)

    fuzzer.explore_fields(valid, case, examples=EXAMPLES, per_example=PER_EXAMPLE)


def test_text_async_refuses_each_bad_field(fuzzer: Fuzzer) -> None:
    explore_route_fields(fuzzer, "text")


def test_chat_async_refuses_each_bad_field(fuzzer: Fuzzer) -> None:
    fuzzer.check_in_workers()
    explore_route_fields(fuzzer, "chat")


def test_pop_refuses_each_bad_field(fuzzer: Fuzzer) -> None:
    explore_route_fields(fuzzer, "pop")


def explore_submits(
    fuzzer: Fuzzer, body: Callable[[str], dict[str, Any]], *, stream: bool, examples: int
) -> None:
    """Mutated submits of ``body(job_id)`` for a job leased per batch."""

    def case(batch: Batch, changes: list[Mutation]) -> None:
        job_id = fuzzer.leased_job(batch, stream=stream)
        for change in changes:
            content, field = change.apply(body(job_id))
            # Once the job is settled, any submit is refused for that, not its fields.
            field = None if batch.settled else field
            answer = post(
                fuzzer, "POST", "/api/v2/generate/text/submit", fuzzer.bob, content, field=field
            )
            if answer is not None and answer.rc is None:
                batch.settled = True

    fuzzer.explore_fields(body(NO_JOB), case, examples=examples, per_example=PER_EXAMPLE)


def test_submit_refuses_each_bad_field(fuzzer: Fuzzer) -> None:
    explore_submits(fuzzer, submit_body, stream=False, examples=EXAMPLES)


def test_chat_submit_refuses_each_bad_field(fuzzer: Fuzzer) -> None:
    explore_submits(fuzzer, chat_submit_body, stream=True, examples=EXAMPLES // 2)


def test_progress_refuses_each_bad_field(fuzzer: Fuzzer) -> None:
    def case(batch: Batch, changes: list[Mutation]) -> None:
        job_id = fuzzer.leased_job(batch, stream=True)
        for change in changes:
            content, field = change.apply(progress_body(job_id))
            post(fuzzer, "POST", "/api/v2/generate/text/progress", fuzzer.bob, content, field=field)

    fuzzer.explore_fields(
        progress_body(NO_JOB), case, examples=EXAMPLES // 2, per_example=PER_EXAMPLE
    )


def test_worker_update_refuses_each_bad_field(fuzzer: Fuzzer) -> None:
    def case(batch: Batch, changes: list[Mutation]) -> None:
        for change in changes:
            content, field = change.apply(worker_body())
            post(
                fuzzer,
                "PUT",
                f"/api/v2/workers/{fuzzer.maintained_id}",
                fuzzer.bob,
                content,
                field=field,
            )

    fuzzer.explore_fields(worker_body(), case, examples=EXAMPLES // 2, per_example=PER_EXAMPLE)


# Whole bodies: not JSON, not an object, cut short, too large -------------------------------


def body_cases() -> st.SearchStrategy[list[tuple[str, bytes]]]:
    one = st.sampled_from(sorted(BODY_ROUTES)).flatmap(
        lambda name: st.tuples(st.just(name), whole_bodies(BODY_ROUTES[name][2]))
    )
    return st.lists(one, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE)


def test_every_body_route_refuses_bodies_that_are_not_its_object(fuzzer: Fuzzer) -> None:
    fuzzer.check_in_workers()

    def case(batch: Batch, cases: list[tuple[str, bytes]]) -> None:
        for name, content in cases:
            send_to_route(fuzzer, batch, name, content)

    fuzzer.explore(
        body_cases(),
        case,
        examples=EXAMPLES,
        min_cases=EXAMPLES * PER_EXAMPLE,
        # Every route gets every core value as its whole body.
        systematic=[[(name, body) for body in CORE_FRAGMENTS] for name in sorted(BODY_ROUTES)],
    )


def test_every_body_route_refuses_a_body_over_the_cap_with_413(fuzzer: Fuzzer) -> None:
    def case(batch: Batch) -> None:
        for method, path, valid, _ in BODY_ROUTES.values():
            answer = post(
                fuzzer,
                method,
                path.format(worker=fuzzer.maintained_id),
                fuzzer.alice,
                huge_body(valid),
                fresh_connection=True,
                accepted=(),
            )
            assert answer is not None
            assert (answer.status, answer.rc) == (413, "PayloadTooLarge"), answer

    fuzzer.check_batch(case)


# Ids and names in paths, and query strings -------------------------------------------


SEGMENTS = [
    "%00",
    "a%00b",
    "%ED%A0%80",
    "%ed%b0%80x",
    "%C0%80",
    "%FF",
    "%F0%9F%92%A5",
    "%E2%80%AE",
    "%",
    "%zz",
    "%2",
    "%20",
    "%09",
    "%0A",
    "%2F..%2F",
    "..%2F..%2F",
    "%2e%2e",
    "..",
    ".",
    "-0",
    "0",
    "1",
    "1e400",
    "NaN",
    "Infinity",
    "9" * 40,
    "-" + "9" * 40,
    "²",
    "x" * 10_000,
    "00000000-0000-0000-0000-000000000000",
    "00000000-0000-4000-8000-00000000000A".lower(),
    "{00000000-0000-4000-8000-000000000001}",
    "urn:uuid:00000000-0000-4000-8000-000000000001",
    "00000000000040008000000000000001",
    "fuzz-chat",
    "FUZZ-CHAT",
    "fuzz-chat%00",
]

segments = st.one_of(
    st.sampled_from(SEGMENTS),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=30).map(lambda s: quote(s, safe="")),
    st.binary(min_size=1, max_size=12).map(lambda b: quote(b, safe="")),
)

PATH_ROUTES = [
    ("GET", "/api/v2/generate/text/status/{}"),
    ("DELETE", "/api/v2/generate/text/status/{}"),
    ("GET", "/api/v2/generate/chat/status/{}"),
    ("DELETE", "/api/v2/generate/chat/status/{}"),
    ("GET", "/api/v2/workers/{}"),
    ("PUT", "/api/v2/workers/{}"),
    ("GET", "/api/v2/workers/name/{}"),
    ("GET", "/api/v2/users/{}"),
    ("GET", "/api/v2/status/models?type={}"),
    ("GET", "/api/v2/status/models?type=text&chat={}"),
    ("GET", "/api/v2/workers?type={}"),
    ("GET", "/api/v2/status/heartbeat?{}"),
    ("GET", "/api/v2/find_user?{}"),
]


def test_every_route_with_an_id_or_name_answers_any_path_with_json(fuzzer: Fuzzer) -> None:
    one = st.tuples(st.sampled_from(PATH_ROUTES), segments)

    def case(batch: Batch, cases: list[tuple[tuple[str, str], str]]) -> None:
        for (method, template), segment in cases:
            content = json.dumps(worker_body()).encode() if method == "PUT" else None
            fuzzer.send(
                method,
                template.format(segment),
                content=content,
                # One kept-alive connection for every case: a path refused
                # before its body was read must leave it ready for the next.
                headers={"apikey": fuzzer.bob, "Content-Type": "application/json"},
            )

    fuzzer.explore(
        st.lists(one, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE),
        case,
        examples=EXAMPLES,
        min_cases=EXAMPLES * PER_EXAMPLE * 8 // 10,  # httpx cannot send a few
        # Every route gets every listed segment.
        systematic=[[(route, segment) for segment in SEGMENTS] for route in PATH_ROUTES],
    )


# Headers --------------------------------------------------------------------------------

HEADER_NAMES = [
    "apikey",
    "Client-Agent",
    "client_agent",
    "Idempotency-Key",
    "Content-Type",
    "Content-Encoding",
    "Accept",
    "Accept-Charset",
    "Expect",
]
HEADER_VALUES = [
    b"",
    b" ",
    b"\t",
    b"0000000000",
    b"fuzz-key",
    b"same-key",
    b"x" * 255,
    b"x" * 256,
    b"x" * 8000,
    b"\xff\xfe",
    b"\xed\xa0\x80",
    b"\xc3\xa9t\xc3\xa9",
    b"%00",
    b"null",
    b"application/json",
    b"application/json; charset=utf-16",
    b"application/json; charset=latin-1",
    b"text/plain",
    b"multipart/form-data; boundary=fuzz",
    b"application/x-www-form-urlencoded",
    b"gzip",
    b"100-continue",
    b"*/*;q=NaN",
]

header_values = st.one_of(
    st.sampled_from(HEADER_VALUES),
    st.binary(max_size=40).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F)),
)


def test_every_body_route_answers_odd_headers_with_json(fuzzer: Fuzzer) -> None:
    fuzzer.check_in_workers()
    one = st.tuples(
        st.sampled_from(sorted(BODY_ROUTES)),
        st.dictionaries(st.sampled_from(HEADER_NAMES), header_values, min_size=1, max_size=3),
    )

    def case(batch: Batch, cases: list[tuple[str, dict[str, bytes]]]) -> None:
        for name, overrides in cases:
            valid = BODY_ROUTES[name][2]
            send_to_route(fuzzer, batch, name, json.dumps(valid).encode(), headers=overrides)

    fuzzer.explore(
        st.lists(one, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE),
        case,
        examples=EXAMPLES,
        min_cases=EXAMPLES * PER_EXAMPLE * 8 // 10,
    )
