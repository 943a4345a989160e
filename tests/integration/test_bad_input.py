"""Bad input over real HTTP: every refusal is a JSON error naming its cause, never a 500,
and nothing is stored or charged by a refused request.

Each route that takes a body runs in a small scene (a requester with kudos, a
worker's owner, maybe a queued request or a leased job); after the refusal the
scene checks that nothing moved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest

from hordelite.config import Config
from hordelite.testing import FakeTextWorker, TestHorde
from tests.integration._env import open_env

pytestmark = pytest.mark.anyio


MODEL = "fake-model"
KUDOS = 100.0
BODY_CAP = 2048
DROP: Any = object()  # an override that removes the key from the valid body


@dataclasses.dataclass
class Scene:
    """A horde with alice (a requester) and bob (a worker's owner) in a known state.

    kind "empty": nothing queued. "queued": alice's request waits, no worker
    has checked in. "leased": bob's worker holds the job of alice's request.
    "registered": bob's worker has checked in, nothing queued.
    """

    kind: str
    horde: TestHorde
    client: httpx.AsyncClient
    alice: str
    bob: str
    worker: FakeTextWorker
    request_id: str = ""
    job_id: str = ""
    worker_id: str = ""

    async def kudos(self, key: str) -> float:
        r = await self.client.get("/api/v2/find_user", headers={"apikey": key})
        assert r.status_code == 200, r.text
        return r.json()["kudos"]  # type: ignore[no-any-return]

    async def status(self) -> dict[str, Any]:
        r = await self.client.get(f"/api/v2/generate/text/status/{self.request_id}")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    async def assert_unchanged(self) -> None:
        """Nothing was stored or charged since the scene was set."""
        assert await self.kudos(self.alice) == KUDOS
        assert await self.kudos(self.bob) == 0
        if self.kind == "queued":
            # No worker checked in, and the request still waits untouched.
            assert (await self.client.get("/api/v2/workers")).json() == []
            status = await self.status()
            assert (status["waiting"], status["processing"], status["done"]) == (1, 0, False)
            return
        if self.kind == "leased":
            status = await self.status()
            assert (status["finished"], status["processing"], status["done"]) == (0, 1, False)
        if self.kind == "registered":
            worker = (await self.client.get(f"/api/v2/workers/{self.worker_id}")).json()
            assert worker["maintenance_mode"] is False
        assert (await self.worker.pop())["id"] is None


@contextlib.asynccontextmanager
async def open_scene(kind: str, **horde_options: Any) -> AsyncIterator[Scene]:
    async with open_env(requester_kudos=KUDOS, **horde_options) as env:
        horde, client, alice, bob = env.horde, env.client, env.requester, env.owner
        async with FakeTextWorker(horde.url, bob, name="scribe", models=[MODEL]) as worker:
            scene = Scene(kind, horde, client, alice, bob, worker)
            if kind in ("queued", "leased"):
                r = await client.post(
                    "/api/v2/generate/text/async",
                    headers={"apikey": alice},
                    json={"prompt": "Once upon", "models": [MODEL]},
                )
                assert r.status_code == 202, r.text
                scene.request_id = r.json()["id"]
            if kind in ("leased", "registered"):
                job = await worker.pop()
                scene.job_id = job["id"] or ""
                assert bool(scene.job_id) == (kind == "leased")
                [listed] = (await client.get("/api/v2/workers")).json()
                scene.worker_id = listed["id"]
            yield scene


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    path: str  # may name {request_id} or {worker_id}
    scene: str
    sender: str  # "alice" or "bob"
    valid_body: Callable[[Scene], dict[str, Any]]

    async def send(
        self,
        scene: Scene,
        content: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send ``content`` (the valid body when None) with the sender's key unless ``headers``."""
        if content is None:
            content = json.dumps(self.valid_body(scene)).encode()
        if headers is None:
            headers = {"apikey": getattr(scene, self.sender)}
        url = self.path.format(request_id=scene.request_id, worker_id=scene.worker_id)
        return await scene.client.request(
            self.method,
            url,
            content=content,
            headers={"Content-Type": "application/json", **headers},
        )


ROUTES = {
    "async": Route(
        "POST",
        "/api/v2/generate/text/async",
        "empty",
        "alice",
        lambda s: {"prompt": "Once upon", "models": [MODEL], "params": {"max_length": 80}},
    ),
    "pop": Route(
        "POST",
        "/api/v2/generate/text/pop",
        "queued",
        "bob",
        lambda s: {
            "name": "probe",
            "models": [MODEL],
            "max_length": 512,
            "max_context_length": 4096,
        },
    ),
    "submit": Route(
        "POST",
        "/api/v2/generate/text/submit",
        "leased",
        "bob",
        lambda s: {"id": s.job_id, "generation": "The end.", "state": "ok", "seed": 1},
    ),
    "worker": Route(
        "PUT", "/api/v2/workers/{worker_id}", "registered", "bob", lambda s: {"maintenance": True}
    ),
}


def with_overrides(body: dict[str, Any], overrides: dict[str, Any]) -> bytes:
    merged = {**body, **overrides}
    return json.dumps({k: v for k, v in merged.items() if v is not DROP}).encode()


def assert_names_field(r: httpx.Response, status: int, rc: str, field: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].split(";")[0] == "application/json"
    answer = r.json()
    assert answer["rc"] == rc, answer
    assert field in answer["message"], answer


# Bodies that are not a JSON object -------------------------------------------

NOT_AN_OBJECT = [
    pytest.param(b'{"prompt": "Once upon",', id="malformed-json"),
    pytest.param(b'[{"prompt": "Once upon"}]', id="array"),
    pytest.param(b'"Once upon"', id="string"),
    pytest.param(b"null", id="null"),
    pytest.param(b"", id="empty"),
    pytest.param(b'{"prompt": "\xff\xfe"}', id="not-utf8"),
]


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("content", NOT_AN_OBJECT)
async def test_a_body_that_is_not_a_json_object_is_refused_with_400_naming_the_body(
    route: str, content: bytes
) -> None:
    async with open_scene(ROUTES[route].scene) as scene:
        r = await ROUTES[route].send(scene, content)
        assert_names_field(r, 400, "BadRequest", "body")
        await scene.assert_unchanged()


# Fields of the wrong type or out of range ---------------------------------------

SIX_WORKERS = [str(uuid.UUID(int=i)) for i in range(1, 7)]


def case(case_id: str, overrides: dict[str, Any], field: str, rc: str = "BadRequest") -> Any:
    """A row: the valid body with ``overrides`` is refused with 400 ``rc`` naming ``field``."""
    return pytest.param(overrides, field, rc, id=case_id)


ASYNC_FIELDS = [
    case("prompt-number", {"prompt": 5}, "prompt"),
    case("prompt-empty", {"prompt": ""}, "prompt", "MissingPrompt"),
    case("params-string", {"params": "fast"}, "params"),
    case("max_length-string", {"params": {"max_length": "80"}}, "params.max_length"),
    case("max_length-fraction", {"params": {"max_length": 80.5}}, "params.max_length"),
    case("max_length-too-small", {"params": {"max_length": 15}}, "params.max_length"),
    case("max_length-too-large", {"params": {"max_length": 4097}}, "params.max_length"),
    case("max_length-huge", {"params": {"max_length": 10**30}}, "params.max_length"),
    case("n-zero", {"params": {"n": 0}}, "params.n"),
    case("n-21", {"params": {"n": 21}}, "params.n"),
    case("context-too-small", {"params": {"max_context_length": 79}}, "params.max_context_length"),
    case(
        "context-below-max_length",
        {"params": {"max_length": 500, "max_context_length": 100}},
        "params.max_context_length",
        "TokenOverflow",
    ),
    case("temperature-string", {"params": {"temperature": "hot"}}, "params.temperature"),
    case("top_k-too-large", {"params": {"top_k": 201}}, "params.top_k"),
    case("stop-string", {"params": {"stop_sequence": "\n"}}, "params.stop_sequence"),
    case("models-string", {"models": MODEL}, "models"),
    case("models-entry-number", {"models": [1]}, "models.0"),
    case("workers-not-uuid", {"workers": ["not-a-uuid"]}, "workers.0"),
    case("workers-six", {"workers": SIX_WORKERS}, "workers"),
    case("trusted_workers-string", {"trusted_workers": "yes"}, "trusted_workers"),
    case("webhook-not-https", {"webhook": "http://example.org/hook"}, "webhook"),
    case("dry-run-checked-too", {"dry_run": True, "params": {"n": 0}}, "params.n"),
]


POP_FIELDS = [
    case("name-number", {"name": 5}, "name"),
    case("name-missing", {"name": DROP}, "name"),
    case("name-blank", {"name": "   "}, "name"),
    case("models-empty", {"models": []}, "models"),
    case("models-entry-null", {"models": [None]}, "models.0"),
    case("max_length-string", {"max_length": "512"}, "max_length"),
    case("max_length-zero", {"max_length": 0}, "max_length"),
    case("context-too-large", {"max_context_length": 2_000_000}, "max_context_length"),
    case("threads-51", {"threads": 51}, "threads"),
    case("nsfw-string", {"nsfw": "yes"}, "nsfw"),
    case("wait-negative", {"wait": -1}, "wait"),
]


SUBMIT_FIELDS = [
    case("id-missing", {"id": DROP}, "id"),
    case("generation-number", {"generation": 5}, "generation"),
    case("state-unknown", {"state": "great"}, "state"),
    case("seed-word", {"seed": "abc"}, "seed"),
    case("seed-past-64-bits", {"seed": 2**63}, "seed"),
    case("gen_metadata-string", {"gen_metadata": "x"}, "gen_metadata"),
    case("gen_metadata-type", {"gen_metadata": [{"type": 1, "value": "v"}]}, "gen_metadata.0.type"),
]


WORKER_FIELDS = [
    case("maintenance-string", {"maintenance": "yes"}, "maintenance"),
    case("maintenance-number", {"maintenance": 1}, "maintenance"),
    case("maintenance-array", {"maintenance": []}, "maintenance"),
]

FIELD_CASES = [
    pytest.param(route, *row.values, id=f"{route}-{row.id}")
    for route, table in [
        ("async", ASYNC_FIELDS),
        ("pop", POP_FIELDS),
        ("submit", SUBMIT_FIELDS),
        ("worker", WORKER_FIELDS),
    ]
    for row in table
]


@pytest.mark.parametrize(("route", "overrides", "field", "rc"), FIELD_CASES)
async def test_a_field_of_the_wrong_type_or_out_of_range_is_refused_with_400_naming_it(
    route: str, overrides: dict[str, Any], field: str, rc: str
) -> None:
    async with open_scene(ROUTES[route].scene) as scene:
        body = with_overrides(ROUTES[route].valid_body(scene), overrides)
        r = await ROUTES[route].send(scene, body)
        assert_names_field(r, 400, rc, field)
        await scene.assert_unchanged()


# JSON numbers Python reads but JSON forbids: NaN, Infinity, and 1e400 (infinite as a float).
NON_FINITE = [
    pytest.param(
        b'{"prompt": "hi", "params": {"temperature": NaN}}', "params.temperature", id="nan"
    ),
    pytest.param(b'{"prompt": "hi", "params": {"top_p": Infinity}}', "params.top_p", id="infinity"),
    pytest.param(
        b'{"prompt": "hi", "params": {"max_length": 1e400}}', "params.max_length", id="overflow"
    ),
]


@pytest.mark.parametrize(("content", "field"), NON_FINITE)
async def test_a_non_finite_number_is_refused_with_400_naming_the_field(
    content: bytes, field: str
) -> None:
    async with open_scene("empty") as scene:
        r = await ROUTES["async"].send(scene, content)
        assert_names_field(r, 400, "BadRequest", field)
        await scene.assert_unchanged()


# Body size cap -------------------------------------------------------------------


def capped() -> Config:
    return Config().replace(server={"max_body_bytes": BODY_CAP})


def padded(body: dict[str, Any], size: int) -> bytes:
    """``body`` with an ignored "padding" key, exactly ``size`` bytes long."""
    bare = json.dumps({**body, "padding": ""}).encode()
    return json.dumps({**body, "padding": "x" * (size - len(bare))}).encode()


@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_body_over_the_cap_is_refused_with_413_PayloadTooLarge(route: str) -> None:
    async with open_scene(ROUTES[route].scene, config=capped()) as scene:
        r = await ROUTES[route].send(scene, padded(ROUTES[route].valid_body(scene), BODY_CAP + 1))
        assert r.status_code == 413, r.text
        assert r.json()["rc"] == "PayloadTooLarge"
        await scene.assert_unchanged()


async def test_a_body_exactly_at_the_cap_is_accepted() -> None:
    async with open_scene("empty", config=capped()) as scene:
        content = padded(ROUTES["async"].valid_body(scene), BODY_CAP)
        assert len(content) == BODY_CAP
        r = await ROUTES["async"].send(scene, content)
        assert r.status_code == 202, r.text


async def test_a_body_slower_than_server_body_timeout_is_refused_with_408() -> None:
    # The headers promise a body that never comes: the answer is 408 once
    # server.body_timeout has passed, not when a fixed literal has.
    config = Config().replace(server={"body_timeout": 0.2})
    async with open_scene("empty", config=config) as scene:
        host, port = scene.horde.url.removeprefix("http://").rsplit(":", 1)
        head = (
            "POST /api/v2/generate/text/async HTTP/1.1\r\n"
            f"Host: {host}\r\napikey: {scene.alice}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(head.encode())
            with anyio.fail_after(10):  # far below the 60 s default
                answer = await stream.receive()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        await scene.assert_unchanged()


# API keys ---------------------------------------------------------------------------

KEYS = (
    [pytest.param(route, None, id=f"{route}-missing") for route in ROUTES]
    + [pytest.param(route, "not-a-key-anyone-has", id=f"{route}-unknown") for route in ROUTES]
    + [
        pytest.param("async", "k" * 300, id="async-longer-than-any-key"),
        pytest.param("pop", "k" * 8000, id="pop-absurdly-long"),
    ]
)


@pytest.mark.parametrize(("route", "key"), KEYS)
async def test_a_missing_or_unknown_apikey_is_refused_with_401_InvalidAPIKey(
    route: str, key: str | None
) -> None:
    async with open_scene(ROUTES[route].scene) as scene:
        r = await ROUTES[route].send(scene, headers={} if key is None else {"apikey": key})
        assert r.status_code == 401, r.text
        answer = r.json()
        assert answer["rc"] == "InvalidAPIKey"
        if key is None:
            assert "apikey" in answer["message"]
        await scene.assert_unchanged()


# Ids in URLs ----------------------------------------------------------------------

ID_ROUTES = [
    pytest.param(
        "GET", "/api/v2/generate/text/status/{}", "queued", "RequestNotFound", id="status"
    ),
    pytest.param(
        "DELETE", "/api/v2/generate/text/status/{}", "queued", "RequestNotFound", id="cancel"
    ),
    pytest.param("GET", "/api/v2/workers/{}", "registered", "WorkerNotFound", id="worker"),
    pytest.param("PUT", "/api/v2/workers/{}", "registered", "WorkerNotFound", id="worker-update"),
]


@pytest.mark.parametrize("bad_id", ["not-a-uuid", "1" * 300], ids=["word", "long"])
@pytest.mark.parametrize(("method", "path", "kind", "rc"), ID_ROUTES)
async def test_a_non_uuid_id_in_the_url_is_404_with_the_routes_rc(
    method: str, path: str, kind: str, rc: str, bad_id: str
) -> None:
    async with open_scene(kind) as scene:
        headers = {"apikey": scene.bob}
        if method == "PUT":
            r = await scene.client.put(
                path.format(bad_id), json={"maintenance": True}, headers=headers
            )
        else:
            r = await scene.client.request(method, path.format(bad_id), headers=headers)
        assert r.status_code == 404, r.text
        assert r.json()["rc"] == rc
        await scene.assert_unchanged()


async def test_a_non_uuid_job_id_on_submit_is_404_InvalidJobID() -> None:
    route = ROUTES["submit"]
    async with open_scene(route.scene) as scene:
        r = await route.send(scene, with_overrides(route.valid_body(scene), {"id": "not-a-uuid"}))
        assert r.status_code == 404, r.text
        assert r.json()["rc"] == "InvalidJobID"
        await scene.assert_unchanged()


# Text no route accepts: a surrogate half or NUL in any string --------------------

# Stands in a valid body where the hostile escape goes, so that the bytes sent
# carry the escape exactly as an attacker writes it.
MARK = "@@MARK@@"
BAD_TEXT = [
    pytest.param(rb"\ud800", id="high-half"),
    pytest.param(rb"\udfff", id="low-half"),
    pytest.param(rb"\u0000", id="nul"),
]
STRING_FIELDS = [
    pytest.param("async", {"prompt": MARK}, "prompt", id="async-prompt"),
    pytest.param("async", {"models": [MARK]}, "models.0", id="async-model"),
    pytest.param(
        "async",
        {"params": {"stop_sequence": [MARK]}},
        "params.stop_sequence.0",
        id="async-stop_sequence",
    ),
    pytest.param("pop", {"name": MARK}, "name", id="pop-name"),
    pytest.param("pop", {"models": [MARK]}, "models.0", id="pop-model"),
    pytest.param("pop", {"bridge_agent": MARK}, "bridge_agent", id="pop-bridge_agent"),
    pytest.param("submit", {"generation": MARK}, "generation", id="submit-generation"),
    pytest.param("worker", {"info": MARK}, "info", id="worker-info"),
]


@pytest.mark.parametrize("bad", BAD_TEXT)
@pytest.mark.parametrize(("route", "overrides", "field"), STRING_FIELDS)
async def test_a_string_with_a_surrogate_half_or_nul_is_refused_with_400_naming_it(
    route: str, overrides: dict[str, Any], field: str, bad: bytes
) -> None:
    async with open_scene(ROUTES[route].scene) as scene:
        body = with_overrides(ROUTES[route].valid_body(scene), overrides)
        r = await ROUTES[route].send(scene, body.replace(MARK.encode(), b"x" + bad))
        assert_names_field(r, 400, "BadRequest", field)
        await scene.assert_unchanged()


@pytest.mark.parametrize("route", list(ROUTES))
async def test_raw_surrogate_bytes_are_refused_with_400_naming_the_body(route: str) -> None:
    async with open_scene(ROUTES[route].scene) as scene:
        body = json.dumps(ROUTES[route].valid_body(scene))[:-1] + ', "x": "@"}'
        r = await ROUTES[route].send(scene, body.encode().replace(b"@", b"\xed\xa0\x80"))
        assert_names_field(r, 400, "BadRequest", "body")
        await scene.assert_unchanged()


@pytest.mark.parametrize("depth", [1_000, 200_000])
@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_deeply_nested_body_is_refused_with_400_not_a_500(route: str, depth: int) -> None:
    async with open_scene(ROUTES[route].scene) as scene:
        r = await ROUTES[route].send(scene, b"[" * depth + b"]" * depth)
        assert_names_field(r, 400, "BadRequest", "body")
        await scene.assert_unchanged()


@pytest.mark.parametrize("seed", [b"Infinity", b"-Infinity", b"1e400", b"NaN"])
@pytest.mark.parametrize("job", ["leased", "unknown"])
async def test_a_non_finite_seed_on_submit_is_refused_with_400_naming_it(
    seed: bytes, job: str
) -> None:
    route = ROUTES["submit"]
    async with open_scene(route.scene) as scene:
        body = route.valid_body(scene)
        if job == "unknown":
            body["id"] = str(uuid.uuid4())
        raw = json.dumps({**body, "seed": MARK}).encode().replace(b'"' + MARK.encode() + b'"', seed)
        r = await route.send(scene, raw)
        assert_names_field(r, 400, "BadRequest", "seed")
        await scene.assert_unchanged()


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/v2/workers/name/%00", "name"),
        ("/api/v2/workers/name/a%00b", "name"),
        ("/api/v2/generate/text/status/%00", "request_id"),
        ("/api/v2/generate/chat/status/%00", "request_id"),
        ("/api/v2/users/%00", "user_id"),
        ("/api/v2/workers?type=%00", "type"),
    ],
)
async def test_nul_in_a_path_or_query_is_refused_with_400_naming_it(path: str, field: str) -> None:
    async with open_scene("registered") as scene:
        r = await scene.client.get(path)
        assert_names_field(r, 400, "BadRequest", field)
        await scene.assert_unchanged()


@pytest.mark.parametrize(
    "path",
    [
        "/api/v2//workers",
        "/api/v2/%2F..%2Fworkers",
        "/api/v2/generate/text/status/%2F..%2F",
        "/api/v2/workers/name/a%2F%2Fb",
        "//api/v2/status/heartbeat",
    ],
)
async def test_a_path_with_doubled_slashes_is_answered_in_json_not_redirected(path: str) -> None:
    async with open_scene("empty") as scene:
        r = await scene.client.get(path)
        assert r.status_code == 404, r.text
        assert r.headers["content-type"].split(";")[0] == "application/json"
        assert r.json()["rc"] in ("NotFound", "RequestNotFound", "WorkerNotFound")


CHAT_BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 16,
    "stop": [MARK],
}


@pytest.mark.parametrize(
    ("path", "stop_field"),
    [("/api/v2/generate/chat/async", "stop.0"), ("/v1/chat/completions", "stop.0")],
)
async def test_requests_with_a_surrogate_stop_cannot_reach_a_worker(
    path: str, stop_field: str
) -> None:
    """Ten anonymous requests whose stop a worker cannot encode are each refused
    with 400 naming the stop; nothing is queued, so no worker can fault on them."""
    async with open_scene("registered") as scene:
        raw = json.dumps(CHAT_BODY).encode().replace(MARK.encode(), rb"\ud800")
        for _ in range(10):
            r = await scene.client.post(
                path,
                content=raw,
                headers={"apikey": "0000000000", "Content-Type": "application/json"},
            )
            assert r.status_code == 400, r.text
            answer = r.json()
            if path.startswith("/v1"):
                assert answer["error"]["param"] == stop_field, answer
            else:
                assert stop_field in answer["message"], answer
        await scene.assert_unchanged()
