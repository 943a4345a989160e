"""The AI Horde's status and document routes real clients call first:
/status/performance (KoboldAI Lite on load, the worker bridge every 60 s),
/status/modes, /status/news, /status/models/{name}, /documents/*, and the
empty teams and styles. Each answer is validated by horde_sdk's own model."""

from __future__ import annotations

import pytest
from horde_sdk.ai_horde_api.apimodels import (
    HordeDocument,
    HordeModes,
    HordePerformanceResponse,
    HordeStatusModelsAllResponse,
    HordeStatusModelsSingleResponse,
    NewsResponse,
)

from hordelite.config import Config
from hordelite.testing import ManualClock
from tests.integration._env import open_env
from tests.integration._helpers import assert_refused

pytestmark = pytest.mark.anyio


async def test_performance_counts_the_queued_text_requests_their_tokens_and_the_pool() -> None:
    clock = ManualClock()
    async with open_env(clock=clock, requester_kudos=1000) as env:
        worker = await env.text_worker(threads=3)
        empty = (await env.client.get("/api/v2/status/performance")).json()
        HordePerformanceResponse.model_validate(empty)
        assert (empty["queued_text_requests"], empty["text_worker_count"]) == (0, 0)

        await worker.pop()  # online, with its 3 threads
        await env.submit_text("one", max_length=100)
        await env.submit_text("two", max_length=50, n=2)
        job = await worker.pop()
        await worker.submit(job["id"], "y" * 400)  # 100 tokens, at most its max_length
        paid_tokens = min(job["payload"]["max_length"], 100)

        clock.advance(10)  # past the cached figures
        body = (await env.client.get("/api/v2/status/performance")).json()
        HordePerformanceResponse.model_validate(body)
        assert (body["text_worker_count"], body["text_thread_count"]) == (1, 3)
        # Image and interrogation figures are 0 on a text horde.
        assert body["queued_requests"] == body["worker_count"] == body["thread_count"] == 0
        # Two jobs left of 100 + 2 x 50 tokens, one of them done.
        queued = 150 if paid_tokens == 50 else 100
        assert (body["queued_text_requests"], body["queued_tokens"]) == (
            1 if queued == 100 else 2,
            queued,
        )
        assert body["past_minute_tokens"] == paid_tokens


async def test_modes_say_the_horde_is_open_and_news_and_documents_are_the_operators() -> None:
    config = Config().replace(
        notices={
            "terms": "Be kind.\n\nNo <script> here.",
            "news": "The horde moved.",
            "news_title": "Moved",
            "news_importance": "Workers",
            "news_published": "2026-12-01",
        }
    )
    async with open_env(config=config) as env:
        modes = (await env.client.get("/api/v2/status/modes")).json()
        HordeModes.model_validate(modes)
        assert modes == {"maintenance_mode": False, "invite_only_mode": False}

        news = (await env.client.get("/api/v2/status/news")).json()
        NewsResponse.model_validate(news)
        assert [
            (n["title"], n["newspiece"], n["importance"], n["date_published"]) for n in news
        ] == [("Moved", "The horde moved.", "Workers", "2026-12-01")]

        html = (await env.client.get("/api/v2/documents/terms")).json()
        HordeDocument.model_validate(html)
        assert html == {"html": "<p>Be kind.</p><p>No &lt;script&gt; here.</p>"}
        markdown = await env.client.get("/api/v2/documents/terms", params={"format": "markdown"})
        assert markdown.json() == {"markdown": "Be kind.\n\nNo <script> here."}
        assert (await env.client.get("/api/v2/documents/privacy")).json() == {"html": ""}
        refused = await env.client.get("/api/v2/documents/terms", params={"format": "pdf"})
        assert_refused(refused, 400, "BadRequest")
        assert "format" in refused.json()["errors"]


async def test_no_news_is_an_empty_list() -> None:
    async with open_env() as env:
        assert (await env.client.get("/api/v2/status/news")).json() == []


def test_a_bad_news_date_or_importance_is_refused_at_start() -> None:
    from hordelite.errors import ConfigError

    with pytest.raises(ConfigError, match=r"notices\.news_published"):
        Config().replace(notices={"news_published": "yesterday"})
    with pytest.raises(ConfigError, match=r"notices\.news_importance"):
        Config().replace(notices={"news_importance": "Gossip"})


async def test_status_models_defaults_to_image_and_a_single_model_is_a_list() -> None:
    async with open_env() as env:
        worker = await env.text_worker(models=["org/m1", "m2"], threads=2)
        await worker.pop()
        # The AI Horde's default type is image: none served here.
        assert (await env.client.get("/api/v2/status/models")).json() == []
        text = (await env.client.get("/api/v2/status/models", params={"type": "text"})).json()
        HordeStatusModelsAllResponse.model_validate(text)
        assert sorted(m["name"] for m in text) == ["m2", "org/m1"]

        one = (await env.client.get("/api/v2/status/models/org/m1")).json()
        HordeStatusModelsSingleResponse.model_validate(one)
        assert [(m["name"], m["count"], m["type"]) for m in one] == [("org/m1", 2, "text")]
        assert (await env.client.get("/api/v2/status/models/unserved")).json() == []

        least = {"type": "text", "min_count": "3"}
        assert (await env.client.get("/api/v2/status/models", params=least)).json() == []
        most = {"type": "text", "max_count": "2"}
        assert len((await env.client.get("/api/v2/status/models", params=most)).json()) == 2
        bad = await env.client.get("/api/v2/status/models", params={"min_count": "-1"})
        assert_refused(bad, 400, "BadRequest")
        assert "min_count" in bad.json()["errors"]


async def test_teams_and_text_styles_are_empty_and_a_team_is_not_found() -> None:
    async with open_env() as env:
        assert (await env.client.get("/api/v2/teams")).json() == []
        assert (await env.client.get("/api/v2/styles/text")).json() == []
        assert_refused(await env.client.get("/api/v2/teams/abc"), 404, "TeamNotFound")


async def test_a_queued_requests_status_counts_its_eligible_workers_and_threads() -> None:
    async with open_env() as env:
        a = await env.text_worker("a", threads=2)
        b = await env.text_worker("b", threads=3)
        c = await env.text_worker("c", ["m2"])
        for worker in (a, b, c):
            await worker.pop()
        served = await env.submit_text("served")
        status = (await env.client.get(f"/api/v2/generate/text/status/{served}")).json()
        assert (status["eligible_workers"], status["eligible_worker_threads"]) == (2, 5)
        assert status["might_stall"] is False
        stuck = await env.submit_text("stuck", models=["nobody"])
        status = (await env.client.get(f"/api/v2/generate/text/status/{stuck}")).json()
        assert (status["eligible_workers"], status["might_stall"]) == (0, True)


async def test_a_text_request_as_queued_is_read_back_by_its_requester_only() -> None:
    async with open_env() as env:
        other = await env.horde.create_key("eve")
        admin = await env.horde.create_key("root", admin=True)
        request_id = await env.submit_text("Once upon a time", max_length=60)
        path = f"/api/v2/generate/text/request/{request_id}"
        for key in (env.requester, admin):
            found = await env.client.get(path, headers={"apikey": key})
            assert found.status_code == 200, found.text
            body = found.json()
            assert (body["prompt"], body["models"]) == ("Once upon a time", ["m1"])
            assert body["params"]["max_length"] == 60
            # horde_sdk 0.33's GenerationSubmittedKobold (0.18 has none).
            assert {"softprompt", "trusted_workers", "slow_workers", "workers"} <= set(body)
            assert (body["worker_blacklist"], body["webhook"]) == (False, None)
        assert_refused(
            await env.client.get(path, headers={"apikey": other}), 403, "WrongCredentials"
        )
        assert_refused(await env.client.get(path), 401, "InvalidAPIKey")
        unknown = "/api/v2/generate/text/request/not-an-id"
        assert_refused(
            await env.client.get(unknown, headers={"apikey": env.requester}), 404, "RequestNotFound"
        )
