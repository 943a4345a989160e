"""The fuzz tier's machinery: a horde in a thread, a checking client, hostile values.

The horde runs in an anyio blocking portal (its own event loop in a thread),
so the hypothesis tests are plain functions sending real HTTP with one
kept-alive ``httpx.Client``. Every answer goes through ``Fuzzer.send``, which
asserts what holds for any input: an answer within the client's timeout, no
5xx, JSON, and for a 4xx a return code and a message (a 400 names the field
that was mutated). ``Fuzzer.check_batch`` runs one hypothesis example: it reads
the rows and balances before and after, and checks that only the accepted
answers stored or charged anything.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import re
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from hordelite.config import Config
from hordelite.storage.schema import requests, users, workers
from hordelite.storage.transaction import Tx
from hordelite.testing import TestHorde, open_horde

# Requests sent per backend and in all, printed at the end of the session.
CASES: Counter[str] = Counter()

# Every answer must come within this many seconds: more is a hang.
CLIENT_TIMEOUT = 10.0
# The body cap of the fuzzed horde: small, so "huge" bodies stay cheap to send.
BODY_CAP = 256 * 1024
# The longest long-poll a pop may ask for: a mutated wait that is valid costs this much.
MAX_POP_WAIT = 0.1

TEXT_MODEL = "fuzz-text-model"  # alice's text requests; no worker pops it
CHAT_MODEL = "fuzz-chat-model"  # the idle chat worker's: chat requests are admitted
SUBMIT_MODEL = "fuzz-submit-model"  # a job is leased for each submit batch
STREAM_MODEL = "fuzz-stream-model"  # a streamed chat job for each progress batch
IDLE_MODEL = "fuzz-idle-model"  # the pop body's: nothing is ever queued for it
FRONT_MODEL = "fuzz-front-model"  # no worker serves it: refused last (503 no_eligible_worker)
# The one refusal above 499 a case may get: the availability refusal of a
# model no online chat worker serves (chat guide, "Worker availability").
AVAILABILITY = (503, "no_eligible_worker")

KUDOS = 1_000_000.0

# 400s that refuse the request as a whole (its size, its state), not a field.
NOT_ABOUT_ONE_FIELD = frozenset(
    {
        "no_worker_supports_limit",
        "DuplicateGen",
        "AbortedGen",
        "MaxKudosExceeded",
        "ChatModelMismatch",
        "ChatSubmitNonconformant",
    }
)

T = TypeVar("T")

# The native envelope names the field as "field: why" (and in ``errors``); the
# front in ``param``. Chat fields are written "messages[0].content".
_INDEX = re.compile(r"\[(\d+)\]")
# A failure's route: its path with the last segment (an id or a name) generalised.
_ROUTE_ID = re.compile(
    r"^(/api/v2/(?:generate/(?:text|chat)/status|workers/name|workers|users)|/v1/models)/.+$"
)


def chat_declaration(model: str) -> dict[str, Any]:
    return {
        "chat_jobs": True,
        "chat_features": ["prompt_overflow_refused"],
        "chat_limits": {"max_context_length": 8192, "max_length": 1024},
        "model_id": model,
        "image_transports": [],
    }


def chat_options() -> dict[str, Any]:
    """Valid values of the OpenAI chat fields that a chat body carries after
    ``max_tokens`` on the native route and at the front alike."""
    return {
        "temperature": 0.7,
        "top_p": 0.9,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "stop": ["\n\n"],
        "seed": 7,
        "stream": False,
        "user": "fuzz",
    }


# The horde's own options of a chat body, valid, on either route.
HORDE_CHAT_OPTIONS = {"conformance": "strict", "context_fit": "none", "max_kudos": 1000}


def pop_body(name: str, model: str, *, chat: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "models": [model],
        "max_length": 1024,
        "max_context_length": 8192,
        "bridge_agent": "hordelite-fuzz:1:test",
    }
    if chat:
        body.update(chat_declaration(model))
    return body


class ServerErrors(logging.Handler):
    """The exceptions the horde logged, as "Type at file:line" of the deepest
    hordelite frame, so that a 500 is reported with its cause."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                frames = [
                    f"{Path(frame.filename).name}:{frame.lineno}"
                    for frame in traceback.extract_tb(exc.__traceback__)
                    if "/hordelite/" in frame.filename
                ]
                self.last = f"{type(exc).__name__} at {frames[-1] if frames else '?'}"
        except Exception:
            self.handleError(record)

    def take(self) -> str:
        last, self.last = self.last, None
        return last or "nothing logged"


@dataclasses.dataclass
class Snapshot:
    requests: int
    workers: int
    kudos: dict[int, float]


def _snapshot(conn: Tx) -> Snapshot:
    return Snapshot(
        requests=conn.execute(select(func.count()).select_from(requests)).scalar_one(),
        workers=conn.execute(select(func.count()).select_from(workers)).scalar_one(),
        kudos={row.id: row.kudos for row in conn.execute(select(users.c.id, users.c.kudos))},
    )


def _is_the_dashboard(response: httpx.Response) -> bool:
    """httpx normalises some sent paths to "/" ("/v1/.."): a GET there is the
    dashboard's page, HTML under its Content-Security-Policy, not an API route."""
    return (
        response.request.url.path == "/"
        and response.request.method in ("GET", "HEAD")
        and response.status_code == 200
        and response.headers.get("content-type", "").startswith("text/html")
        and "content-security-policy" in response.headers
    )


@dataclasses.dataclass
class Answer:
    """One checked answer: its status, decoded JSON, and the field a 400 named."""

    status: int
    body: Any
    rc: str | None
    named: str | None


@dataclasses.dataclass
class Batch:
    """What one hypothesis example's accepted answers may have stored or charged."""

    new_request_ids: dict[str, str] = dataclasses.field(default_factory=dict)  # id: kind
    accepted_pops: int = 0
    settled: bool = False  # a job was submitted: its requester paid, its worker earned
    # Requests the scene queued itself, cancelled after the checks with the new ones.
    scene_requests: dict[str, str] = dataclasses.field(default_factory=dict)


class Fuzzer:
    """A running horde with alice (requester), bob (workers' owner), carol (front caller)."""

    def __init__(self, portal: BlockingPortal, horde: TestHorde, label: str) -> None:
        self.portal = portal
        self.horde = horde
        self.label = label
        self.client = self._new_client()
        self.alice = portal.call(lambda: horde.create_key("alice", kudos=KUDOS))
        self.bob = portal.call(lambda: horde.create_key("bob", kudos=KUDOS))
        self.carol = portal.call(lambda: horde.create_key("carol", kudos=KUDOS))
        self.known_ids: set[str] = set()
        self.failures: dict[str, list[str]] = {}
        self.errors = ServerErrors()
        self.previous = ""  # the last case sent on the kept-alive connection
        logging.getLogger("hordelite").addHandler(self.errors)
        # The workers every scene needs: one per purpose, all bob's.
        self.check_in_workers()
        maintained = self.call("GET", "/api/v2/workers/name/fuzz-maintained")
        self.maintained_id: str = maintained.json()["id"]

    def _new_client(self) -> httpx.Client:
        return httpx.Client(base_url=self.horde.url, timeout=CLIENT_TIMEOUT)

    def close(self) -> None:
        logging.getLogger("hordelite").removeHandler(self.errors)
        self.client.close()

    # Plain calls, for setting a scene (they must succeed) -----------------

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self.client.request(method, path, **kwargs)
        assert response.status_code < 300, (method, path, response.status_code, response.text)
        return response

    def check_in_workers(self) -> None:
        """Pop once with each of bob's workers, so that they are online and known."""
        for name, model, chat in [
            ("fuzz-chat", CHAT_MODEL, True),
            ("fuzz-maintained", IDLE_MODEL, False),
            ("fuzz-submitter", SUBMIT_MODEL, False),
            ("fuzz-streamer", STREAM_MODEL, True),
        ]:
            answer = self.call(
                "POST",
                "/api/v2/generate/text/pop",
                headers={"apikey": self.bob},
                json=pop_body(name, model, chat=chat),
            ).json()
            assert answer["id"] is None, answer

    def leased_job(self, batch: Batch, *, stream: bool = False) -> str:
        """The job of a new request of alice's, leased to one of bob's workers.

        ``stream``: a streamed chat job, which takes progress posts.
        """
        if stream:
            path = "/api/v2/generate/chat/async"
            body: dict[str, Any] = {
                "model": STREAM_MODEL,
                "messages": [{"role": "user", "content": "Count to three."}],
                "max_tokens": 64,
                "stream": True,
            }
            worker = pop_body("fuzz-streamer", STREAM_MODEL, chat=True)
        else:
            path = "/api/v2/generate/text/async"
            body = {"prompt": "Once upon a time", "models": [SUBMIT_MODEL]}
            worker = pop_body("fuzz-submitter", SUBMIT_MODEL)
        request_id = self.call("POST", path, headers={"apikey": self.alice}, json=body).json()["id"]
        self.known_ids.add(request_id)
        batch.scene_requests[request_id] = "chat" if stream else "text"
        job = self.call(
            "POST", "/api/v2/generate/text/pop", headers={"apikey": self.bob}, json=worker
        ).json()
        assert job["id"], job
        return str(job["id"])

    def cancel(self, request_id: str, kind: str = "text") -> None:
        self.call("DELETE", f"/api/v2/generate/{kind}/status/{request_id}")

    # The checked send -------------------------------------------------------

    def fail(self, kind: str, method: str, path: str, detail: str) -> None:
        """Record a failing case; ``explore`` reports them all, grouped, at its end."""
        route = _ROUTE_ID.sub(r"\1/{id}", path.split("?")[0])[:80]
        self.failures.setdefault(f"{kind}: {method} {route}", []).append(detail)

    def send(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: dict[str, Any] | None = None,
        field: str | None = None,
        accepted: tuple[int, ...] = (200,),
        fresh_connection: bool = False,
    ) -> Answer | None:
        """Send one case and check its answer; None when it failed or httpx cannot send it.

        ``field`` is the dotted path of the mutated field (None when the
        whole body or a header was mutated): a 400 must name it, a parent of
        it or a part of it. ``accepted`` are the statuses of an accepted case.
        """
        client = self._new_client() if fresh_connection else self.client
        try:
            response = client.request(method, path, content=content, headers=headers)
        except (httpx.LocalProtocolError, httpx.InvalidURL, UnicodeEncodeError):
            return None  # the client refuses to send it: not a case
        except httpx.TimeoutException:
            CASES[self.label] += 1
            self.fail(
                "no answer in time",
                method,
                path,
                f"{path[:200]} body={content!r:.200}, sent after: {self.previous}",
            )
            self.renew_connection()
            return None
        finally:
            if fresh_connection:
                client.close()
        CASES[self.label] += 1
        self.previous = f"{method} {path[:200]} body={content!r:.100} -> {response.status_code}"
        answer = self.check(response, method, path, content, field, accepted)
        if answer is None:
            # A failed case may have left the connection in any state: a
            # fresh one keeps it from hiding the next case's answer.
            self.renew_connection()
        return answer

    def renew_connection(self) -> None:
        self.client.close()
        self.client = self._new_client()

    def check(
        self,
        response: httpx.Response,
        method: str,
        path: str,
        content: bytes | None,
        field: str | None,
        accepted: tuple[int, ...],
    ) -> Answer | None:
        status = response.status_code
        detail = (
            f"{path[:120]} field={field} body={content!r:.300} -> {status} {response.text[:300]}"
        )
        if status >= 500 and (status, _rc_of(response)) != AVAILABILITY:
            rc = _rc_of(response)
            self.fail(f"{status} {rc} ({self.errors.take()})", method, path, detail)
            return None
        if _is_the_dashboard(response):
            return Answer(status, None, None, None)
        if response.headers.get("content-type", "").split(";")[0] != "application/json":
            self.fail(f"{status} not JSON", method, path, detail)
            return None
        try:
            body = response.json()
        except ValueError:
            self.fail(f"{status} not JSON", method, path, detail)
            return None
        if status in accepted:
            return Answer(status, body, None, None)
        # httpx may have normalised the path ("/v1/.." is "/"): the envelope is the sent path's.
        rc, message, named = _refusal(response.request.url.path, body)
        refused = 400 <= status < 500 or (status, rc) == AVAILABILITY
        if not (refused and isinstance(rc, str) and isinstance(message, str)):
            self.fail(f"{status} not an error envelope", method, path, detail)
            return None
        if (
            status == 400
            and field is not None
            and rc not in NOT_ABOUT_ONE_FIELD
            and not _names(named, message, field)
        ):
            self.fail(f"400 {rc} not naming the field", method, path, detail)
        return Answer(status, body, rc, named)

    # Batches ---------------------------------------------------------------

    def explore(
        self,
        strategy: st.SearchStrategy[T],
        case: Callable[[Batch, T], None],
        *,
        examples: int,
        min_cases: int,
        systematic: Iterable[T] = (),
    ) -> None:
        """Run ``case`` on each ``systematic`` value, then on ``examples``
        derandomized examples of ``strategy``, each checked as a batch; then
        fail with every failing case, grouped by route and kind."""
        before = CASES[self.label]
        self.failures = {}
        for value in systematic:
            self.check_batch(lambda batch, value=value: case(batch, value))

        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def run(value: T) -> None:
            self.check_batch(lambda batch: case(batch, value))

        run()
        sent = CASES[self.label] - before
        assert sent >= min_cases, f"only {sent} cases were sent"
        assert not self.failures, report(self.failures)

    def check_batch(self, case: Callable[[Batch], None]) -> None:
        """Run one example: only its accepted answers may store or charge anything."""
        before = self.portal.call(self.horde.horde.db.read, _snapshot)
        batch = Batch()
        case(batch)
        after = self.portal.call(self.horde.horde.db.read, _snapshot)
        added = after.requests - before.requests - len(batch.scene_requests)
        if added != len(batch.new_request_ids):
            self.fail("requests stored by refused cases", "", "", f"{before} {after} {batch}")
        if not 0 <= after.workers - before.workers <= batch.accepted_pops:
            self.fail("workers stored by refused pops", "", "", f"{before} {after} {batch}")
        if not batch.settled and after.kudos != before.kudos:
            self.fail("kudos moved by refused cases", "", "", f"{before} {after} {batch}")
        self.known_ids.update(batch.new_request_ids)
        for request_id, kind in {**batch.scene_requests, **batch.new_request_ids}.items():
            self.cancel(request_id, kind)

    def note_request(self, batch: Batch, answer: Answer | None, kind: str) -> None:
        """Count the request an accepted answer created (not a replay, not a refusal)."""
        if answer is None or answer.rc is not None or not isinstance(answer.body, dict):
            return
        request_id = answer.body.get("id")
        if isinstance(request_id, str) and request_id not in self.known_ids:
            batch.new_request_ids[request_id] = kind

    def explore_fields(
        self,
        valid: Any,
        case: Callable[[Batch, list[Mutation]], None],
        *,
        examples: int,
        per_example: int,
    ) -> None:
        """``explore`` a valid body field by field: ``case`` gets batches of
        ``per_example`` mutations of ``valid``, first its ``sweep``, then
        ``examples`` examples, each of whose cases must be sent."""
        self.explore(
            st.lists(mutations(valid), min_size=per_example, max_size=per_example),
            case,
            examples=examples,
            min_cases=examples * per_example,
            systematic=sweep(valid),
        )


def report(failures: dict[str, list[str]]) -> str:
    lines = [f"{sum(map(len, failures.values()))} failing cases:"]
    for kind, details in sorted(failures.items()):
        lines.append(f"  {len(details):5d}  {kind}")
        lines += [f"           e.g. {d}" for d in details[:2]]
    return "\n".join(lines)


def _rc_of(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return "(not JSON)"
    if isinstance(body, dict):
        error = body.get("error")
        return str(body.get("rc") or (error.get("code") if isinstance(error, dict) else None))
    return "?"


def _refusal(path: str, body: Any) -> tuple[Any, Any, str | None]:
    """(rc, message, named field) of a native or OpenAI error envelope."""
    assert isinstance(body, dict), body
    if path.startswith("/v1"):
        error = body.get("error")
        assert isinstance(error, dict), body
        param = error.get("param")
        return error.get("code"), error.get("message"), param if isinstance(param, str) else None
    errors = body.get("errors")
    named = None
    if isinstance(errors, dict) and errors:
        named = next(iter(errors))
    elif isinstance(body.get("message"), str) and ": " in body["message"]:
        named = body["message"].split(": ", 1)[0]
    return body.get("rc"), body.get("message"), named


def _names(named: str | None, message: str, field: str) -> bool:
    """The refusal names the mutated field, one of its parents, or a part of it
    (in its ``errors``/``param``, or in its message)."""
    field = _INDEX.sub(r".\1", field)
    if named is not None:
        named = _INDEX.sub(r".\1", named)
        if (
            named in ("body", field)
            or named.startswith(field + ".")
            or field.startswith(named + ".")
        ):
            return True
    message = _INDEX.sub(r".\1", message)
    steps = field.split(".")
    return any(".".join(steps[:n]) in message for n in range(len(steps), 0, -1))


# Hostile values ----------------------------------------------------------------

DEEP = 1500  # deeper than Python's default recursion limit of 1000


def _fixed_fragments() -> list[bytes]:
    return [
        # Wrong types.
        b"null",
        b"true",
        b"false",
        b"0",
        b"1",
        b"-1",
        b"0.5",
        b'""',
        b'" "',
        b'"x"',
        b"[]",
        b"{}",
        b"[null]",
        b'[""]',
        b"[[]]",
        b"[{}]",
        b'{"": null}',
        b'{"a": [1, {"b": null}]}',
        # Extreme numbers.
        b"-0",
        b"-0.0",
        b"1e400",
        b"-1e400",
        b"1e-400",
        b"1.7976931348623157e308",
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"[NaN]",
        b'{"x": Infinity}',
        b"9223372036854775807",
        b"9223372036854775808",
        b"-9223372036854775809",
        b"18446744073709551616",
        b"2147483648",
        b"9007199254740993",
        b"1" + b"0" * 400,
        b"-" + b"9" * 4000,
        b"9" * 5000,  # more digits than Python converts by default
        b"1e309",
        b"0.1e-999999",
        b"123456789012345678901234567890.5",
        # Strings: lone surrogates, escaped and as raw (invalid UTF-8) bytes.
        b'"\\ud800"',
        b'"a\\udfffb"',
        b'"\\udc00\\ud800"',
        b'"\\ud83d"',
        b'"\xed\xa0\x80"',
        b'"a\xed\xb0\x80b"',
        b'["\\ud800"]',
        b'{"\\ud800": 1}',
        # NUL, escaped, raw and as modified UTF-8.
        b'"\\u0000"',
        b'"a\\u0000b"',
        b'"a\x00b"',
        b'"\xc0\x80"',
        b'["\\u0000"]',
        b'{"a\\u0000": 1}',
        b'"%00"',
        # Other odd strings.
        b'"\xff\xfe"',
        b'"\xef\xbb\xbfx"',
        b'"\\u202e\\u0301\\ufeff\\uffff"',
        b'"\xf0\x9f\x92\xa5"',
        b'"\\n\\r\\t"',
        b'"../../etc/passwd"',
        b'"%2F..%2F"',
        b'"https://example.org/\\u0000"',
        b'"x"' * 1,
        b'"' + b"x" * 70_000 + b'"',
        b'"' + b"\\ud800" * 5000 + b'"',
        b"[" + b'"x",' * 5000 + b'"x"]',
        # Deep nesting.
        b"[" * DEEP + b"]" * DEEP,
        b'{"a":' * DEEP + b"0" + b"}" * DEEP,
        b'[{"a":' * (DEEP // 2) + b"null" + b"}]" * (DEEP // 2),
        b"[" * 100_000 + b"]" * 100_000,
        # Malformed fragments (the whole body becomes malformed).
        b"[1,",
        b'{"a"}',
        b"'x'",
        b"undefined",
        b"0x10",
        b"01",
        b"+1",
        b".5",
        b"",
        b'"unterminated',
        b"[" * DEEP,
    ]


FIXED_FRAGMENTS = _fixed_fragments()

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)

# Any code point, lone surrogates included, sent escaped or as raw bytes.
_any_text = st.text(st.characters(codec=None, categories=None), max_size=12)


def _raw_string(text: str, escaped: bool) -> bytes:
    return json.dumps(text, ensure_ascii=escaped).encode("utf-8", "surrogatepass")


fragments: st.SearchStrategy[bytes] = st.one_of(
    st.sampled_from(FIXED_FRAGMENTS),
    st.sampled_from(FIXED_FRAGMENTS),
    _json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(_raw_string, _any_text, st.booleans()),
)


# Mutating valid bodies ------------------------------------------------------------

FieldPath = tuple[str | int, ...]
HOLE = "\u2063fuzz-hole\u2063"
_HOLE_JSON = json.dumps(HOLE).encode()


def paths_of(value: Any, prefix: FieldPath = ()) -> list[FieldPath]:
    """Every path into ``value``, the root included, parents first."""
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += paths_of(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += paths_of(child, (*prefix, i))
    return out


def dotted(path: FieldPath) -> str:
    return ".".join(str(p) for p in path) or "body"


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One change to a valid body: replace, drop, or add a key beside, at ``path``."""

    op: str  # "replace", "drop", "extra"
    path: FieldPath
    fragment: bytes

    def apply(self, body: Any) -> tuple[bytes, str | None]:
        """The mutated body's bytes, and the field a 400 should name (None: any)."""
        if self.op == "drop" and not self.path:
            return b"", None
        if self.op == "replace" and not self.path:
            return self.fragment, None
        body = copy.deepcopy(body)
        path = self.path
        if self.op == "extra":
            target = body
            for step in path:
                target = target[step]
            # A key beside the others (a list or a scalar gets replaced instead).
            path = (*path, "fuzz_extra") if isinstance(target, dict) else path
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        if self.op == "drop":
            del parent[path[-1]]
            return json.dumps(body).encode(), dotted(path)
        parent[path[-1]] = HOLE
        return json.dumps(body).encode().replace(_HOLE_JSON, self.fragment, 1), dotted(path)


# The sweep's values: one of each kind that has broken something somewhere.
CORE_FRAGMENTS = [
    b"null",
    b"true",
    b"-1",
    b"-0",
    b"0.5",
    b"1e400",
    b"-Infinity",
    b"NaN",
    b"1" + b"0" * 400,
    b"9" * 5000,
    b"18446744073709551616",
    b'""',
    b'"x"',
    b'"\\ud800"',
    b'"a\xed\xa0\x80b"',
    b'"a\\u0000b"',
    b'"\xff"',
    b'"' + b"x" * 70_000 + b'"',
    b"[]",
    b'["\\udfff"]',
    b"{}",
    b'{"\\u0000": 1}',
    b"[" * DEEP + b"]" * DEEP,
    b'{"a":' * DEEP + b"0" + b"}" * DEEP,
]


def sweep(valid: Any) -> list[list[Mutation]]:
    """Field by field: each field of ``valid`` replaced by every core value, then
    dropped, and a key added beside it; one list (one batch) per field."""
    out = []
    for path in paths_of(valid)[1:]:
        changes = [Mutation("replace", path, f) for f in CORE_FRAGMENTS]
        changes.append(Mutation("drop", path, b""))
        changes.append(Mutation("extra", path, b'"\\u0000\\ud800"'))
        out.append(changes)
    return out


def mutations(valid: Any) -> st.SearchStrategy[Mutation]:
    return st.builds(
        Mutation,
        st.sampled_from(["replace", "replace", "replace", "drop", "extra"]),
        st.sampled_from(paths_of(valid)),
        fragments,
    )


# Whole bodies that are not a JSON object, or not one this size.
def whole_bodies(valid: Any) -> st.SearchStrategy[bytes]:
    raw = json.dumps(valid).encode()
    return st.one_of(
        fragments,
        st.integers(0, len(raw) - 1).map(lambda n: raw[:n]),  # cut short
        st.just(b"\xef\xbb\xbf" + raw),  # a byte order mark
        st.just(raw + b"\x00"),
        st.just(raw + b" garbage"),
        st.just(raw.replace(b"{", b"{\n" + b" " * 100_000, 1)),  # big but legal
        st.just(b"\xff" * 64),
        st.just(raw.decode().encode("utf-16")),
    )


def huge_body(valid: Any) -> bytes:
    """``valid`` padded with an ignored key to just over the body cap."""
    return json.dumps({**valid, "fuzz_padding": "x" * BODY_CAP}).encode()


# The horde -------------------------------------------------------------------------


@contextlib.contextmanager
def running_fuzzer(backend: str, database: str | None, label: str) -> Iterator[Fuzzer]:
    """A horde on ``backend`` ("trio" or "asyncio") with its fuzzing client."""
    config = Config().replace(
        server={"max_body_bytes": BODY_CAP},
        horde={"concurrency": 0, "max_pop_wait": MAX_POP_WAIT},
        # The fuzzer queues hundreds of valid requests a minute from one key;
        # the byte and image budgets stay as they are by default.
        budgets={
            "requests_per_minute": 0,
            "anonymous_requests_per_minute": 0,
            "requests_held": 0,
            "anonymous_requests_held": 0,
        },
    )
    with (
        start_blocking_portal(backend) as portal,
        portal.wrap_async_context_manager(open_horde(config=config, database=database)) as horde,
    ):
        fuzzer = Fuzzer(portal, horde, label)
        try:
            yield fuzzer
        finally:
            fuzzer.close()
