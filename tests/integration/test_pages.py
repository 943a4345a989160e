"""Pages whose cost does not grow with the pool (decision 0048), over real
HTTP against a pool as large as the wire allows a worker to declare: 400
workers of 100 models each, every name 255 characters of the characters
that escape the longest, and 220 requests of 100 models queued. ``GET /``,
``/dashboard/pool`` and ``/metrics`` stay under the sizes
docs/reference/dashboard.md and metrics.md state; ``/api/v2/workers`` and
``/api/v2/status/models`` answer pages horde_sdk still reads; the dashboard
is rendered once per period and /metrics reads the queue once per second,
however many clients poll; a figure /metrics cannot read is logged once.

The registration caps (``budgets.workers_per_user``, ``models_per_worker``)
are lifted here: the pool is the worst case the wire allows, not what one
user may register.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from horde_sdk.ai_horde_api.apimodels import AllWorkersDetailsResponse, HordeStatusModelsAllResponse
from prometheus_client.parser import text_string_to_metric_families
from quart.signals import template_rendered
from sqlalchemy import Connection, text

from hordelite.clock import ManualClock
from hordelite.config import Config
from hordelite.contract.limits import (
    DASHBOARD_CHAT_MODELS,
    DASHBOARD_MODELS,
    DASHBOARD_POOL_SECONDS,
    DASHBOARD_WORKER_MODELS,
    DASHBOARD_WORKERS,
    MAX_MODELS,
    MAX_NAME,
    MAX_PAGE,
    METRICS_MODELS,
    METRICS_READ_SECONDS,
    MODELS_PAGE,
    WORKERS_PAGE,
)
from hordelite.storage.transaction import Tx
from hordelite.testing import TestHorde, open_horde
from tests.integration._env import open_env
from tests.integration._helpers import assert_refused, statements
from tests.storage.helpers import (
    FEW_PARAMETERS,
    POSTGRES_MAX_PARAMETERS,
    clone_workers,
    parameter_counts,
)

pytestmark = pytest.mark.anyio

# The sizes the reference docs state (docs/reference/dashboard.md, metrics.md).
PAGE_BOUND = 256 * 1024
POOL_BOUND = 256 * 1024
METRICS_BOUND = 128 * 1024
# The queue depth's series: the top models, other, any and unserved, by two kinds.
QUEUE_SERIES_BOUND = 2 * (METRICS_MODELS + 3)

WORKERS = 400
REQUESTS = 220
UNCAPPED = Config().replace(budgets={"workers_per_user": 0, "models_per_worker": MAX_MODELS})


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # What these tests bound does not depend on the event loop; and the
    # module's tests share one pool of 40,000 models (built once: about 8 s).
    return "trio"


def long_name(prefix: str) -> str:
    """A name of MAX_NAME characters, each escaped at its longest: '&' and
    '"' take 5 bytes in HTML, '"' 2 in JSON and the exposition."""
    return (prefix + '&"' * MAX_NAME)[:MAX_NAME]


def worker_name(i: int) -> str:
    return long_name(f"worker-{i:03d}-")


def model_name(i: int, j: int) -> str:
    return long_name(f"model-{i:03d}-{j:02d}-")


@dataclasses.dataclass
class BigPool:
    horde: TestHorde
    client: httpx.AsyncClient


async def _queue(horde: TestHorde, key: str, models: list[str]) -> None:
    body = {"prompt": "Once upon a time", "params": {"max_length": 16}, "models": models}
    assert (await horde.horde.submit_text(key, body, "pages-test:1:test")).id


@pytest.fixture(scope="module")
async def big_pool() -> AsyncIterator[BigPool]:
    """WORKERS workers of MAX_MODELS models each, checked in by their pops,
    and REQUESTS requests each naming one worker's 100 models (request n the
    models of worker n), then two more for worker 0's models (so that they
    lead the queue), one for a model nobody serves and one for any model.
    Pops and submits go through the horde in process: over HTTP, 400 pops
    and 220 submits of 26 KB bodies would double the set-up; what the tests
    read, they read over HTTP."""
    async with (
        open_horde(config=UNCAPPED) as horde,
        httpx.AsyncClient(base_url=horde.url, timeout=60) as client,
    ):
        owner = await horde.create_key("owner")
        for i in range(WORKERS):
            body = {
                "name": worker_name(i),
                "models": [model_name(i, j) for j in range(MAX_MODELS)],
                "max_length": 512,
                "max_context_length": 4096,
                "bridge_agent": "hordelite-pages-test:1:test",
            }
            assert (await horde.horde.pop(owner, body)).job is None
        keys = [await horde.create_key(f"requester-{k}", kudos=10_000) for k in range(12)]
        for n in range(REQUESTS + 2):
            models = [model_name(n % WORKERS if n < REQUESTS else 0, j) for j in range(MAX_MODELS)]
            await _queue(horde, keys[n % len(keys)], models)
        await _queue(horde, keys[0], ["nobody-serves-this"])
        await _queue(horde, keys[1], [])
        yield BigPool(horde, client)


async def test_the_dashboard_of_a_pool_of_40000_models_stays_under_its_stated_size(
    big_pool: BigPool,
) -> None:
    page = await big_pool.client.get("/")
    pool = await big_pool.client.get("/dashboard/pool")
    assert page.status_code == 200, page.text
    assert pool.status_code == 200, pool.text
    # Without the caps the page was 13 MB of such a pool.
    assert len(page.content) < PAGE_BOUND, len(page.content)
    assert len(pool.content) < POOL_BOUND, len(pool.content)
    body = pool.json()
    assert len(body["models"]) == DASHBOARD_MODELS
    assert body["more_models"] == WORKERS * MAX_MODELS - DASHBOARD_MODELS
    assert len(body["workers"]) == DASHBOARD_WORKERS
    assert body["more_workers"] == WORKERS - DASHBOARD_WORKERS
    for w in body["workers"]:
        assert len(w["models"]) == DASHBOARD_WORKER_MODELS
        assert w["more_models"] == MAX_MODELS - DASHBOARD_WORKER_MODELS
    assert (body["chat_models"], body["more_chat_models"]) == ([], 0)
    # The page says so too, with the names escaped.
    assert f"and {WORKERS * MAX_MODELS - DASHBOARD_MODELS} more models" in page.text
    assert f"and {WORKERS - DASHBOARD_WORKERS} more workers" in page.text
    assert f"and {MAX_MODELS - DASHBOARD_WORKER_MODELS} more</td>" in page.text
    assert page.text.count("&amp;&#34;") > DASHBOARD_MODELS * 100
    assert '&"' not in page.text


def queue_depth(exposition: str) -> dict[tuple[str, str], float]:
    """The queue depth's samples, by (model, kind)."""
    return {
        (s.labels["model"], s.labels["kind"]): s.value
        for family in text_string_to_metric_families(exposition)
        if family.name == "hordelite_queue_depth"
        for s in family.samples
    }


async def test_metrics_of_a_pool_of_40000_models_label_the_top_models_and_sum_the_rest(
    big_pool: BigPool,
) -> None:
    scraped = await big_pool.client.get("/metrics")
    assert scraped.status_code == 200, scraped.text
    # Without the bound the exposition was 1.35 MB of such a pool (22,000 series).
    assert len(scraped.content) < METRICS_BOUND, len(scraped.content)
    depth = queue_depth(scraped.text)
    assert len(depth) <= QUEUE_SERIES_BOUND
    labelled = {model for model, _ in depth} - {"other", "any", "unserved"}
    assert len(labelled) == METRICS_MODELS
    # Worker 0's models have 3 jobs each and come first, then by name.
    assert labelled == {model_name(0, j) for j in range(METRICS_MODELS)}
    assert all(depth[(m, "text")] == 3 for m in labelled)
    # Every served model's jobs are still counted, under their names or
    # summed under other: 22,200 jobs of a served model.
    served_jobs = (REQUESTS + 2) * MAX_MODELS
    assert depth[("other", "text")] == served_jobs - 3 * METRICS_MODELS
    assert depth[("unserved", "text")] == 1
    assert depth[("any", "text")] == 1


async def test_the_native_listings_answer_pages_horde_sdk_reads_with_the_total_and_the_next(
    big_pool: BigPool,
) -> None:
    client = big_pool.client
    seen: list[str] = []
    path = "/api/v2/workers?type="
    while path:
        response = await client.get(path)
        assert response.status_code == 200, response.text
        assert response.headers["x-total-count"] == str(WORKERS)
        listed = response.json()
        assert len(listed) <= WORKERS_PAGE
        # Still the AI Horde's list of workers, as horde_sdk models it.
        AllWorkersDetailsResponse.model_validate(listed)
        seen += [w["name"] for w in listed]
        link = response.headers.get("link")
        path = link[1 : link.index(">")] if link else ""
        assert not link or link.endswith('>; rel="next"'), link
    assert sorted(seen) == sorted(worker_name(i) for i in range(WORKERS))
    assert len(set(seen)) == WORKERS
    past = await client.get(f"/api/v2/workers?page={WORKERS // WORKERS_PAGE + 1}")
    assert (past.status_code, past.json()) == (200, [])

    first = await client.get("/api/v2/status/models?type=text")
    assert first.status_code == 200, first.text
    assert first.headers["x-total-count"] == str(WORKERS * MAX_MODELS)
    assert first.headers["link"] == '</api/v2/status/models?type=text&page=2>; rel="next"'
    models = first.json()
    assert len(models) == MODELS_PAGE
    HordeStatusModelsAllResponse.model_validate(models)
    # Most threads first, then by name: each model here has one thread.
    assert [m["name"] for m in models] == sorted(m["name"] for m in models)
    assert all(m["count"] == 1 for m in models)
    last_page = math.ceil(WORKERS * MAX_MODELS / MODELS_PAGE)
    last = await client.get(f"/api/v2/status/models?type=text&page={last_page}")
    assert len(last.json()) == WORKERS * MAX_MODELS - (last_page - 1) * MODELS_PAGE
    assert "link" not in last.headers
    assert (await client.get(f"/api/v2/status/models?type=text&page={last_page + 1}")).json() == []


@pytest.mark.parametrize(
    "page", ["0", "-1", "abc", "1.5", "1e3", "²", str(MAX_PAGE + 1), "9" * 5000, " 1"]
)
async def test_a_page_number_out_of_range_or_not_a_number_is_a_400_naming_page(page: str) -> None:
    async with open_env() as env:
        for path in ("/api/v2/workers", "/api/v2/status/models"):
            response = await env.client.get(path, params={"page": page})
            assert_refused(response, 400, "BadRequest")
            assert "page" in response.json()["errors"], response.text


async def test_the_dashboard_is_rendered_once_per_period_for_every_client() -> None:
    clock = ManualClock(1_800_000_000.0)
    rendered: list[str] = []

    def count(app: Any, template: Any, context: Any) -> None:
        rendered.append(template.name)

    async with open_env(clock=clock) as env:
        body = {"name": "first", "models": ["m1"], "max_length": 80, "max_context_length": 1024}
        await env.horde.horde.pop(env.owner, body)
        with template_rendered.connected_to(count):
            first = {"/": await env.client.get("/")}
            # The page and the pool's JSON share one reading of the pool.
            with statements(env.horde) as sent:
                first["/dashboard/pool"] = await env.client.get("/dashboard/pool")
            assert sent == []
            await env.horde.horde.pop(env.owner, {**body, "name": "second"})
            # Within the period: the same bytes for every client, not one
            # statement sent and the page not rendered again.
            with statements(env.horde) as sent:
                again = [
                    {path: await env.client.get(path) for path in ("/", "/dashboard/pool")}
                    for _ in range(5)
                ]
            assert sent == []
            assert rendered == ["dashboard.html"]
            for answers in again:
                for path, response in answers.items():
                    assert response.content == first[path].content, path
            assert [w["name"] for w in first["/dashboard/pool"].json()["workers"]] == ["first"]
            # A period later, rendered again: the second worker shows.
            clock.advance(DASHBOARD_POOL_SECONDS)
            later = (await env.client.get("/dashboard/pool")).json()
            assert sorted(w["name"] for w in later["workers"]) == ["first", "second"]
            assert "second" in (await env.client.get("/")).text
            assert rendered == ["dashboard.html"] * 2


async def test_the_playground_offers_the_chat_models_with_most_chat_workers() -> None:
    async with open_env(config=UNCAPPED) as env:
        chat_models = DASHBOARD_CHAT_MODELS + 5
        # Each model is served by one chat worker, the last five by name by two.
        doubled = [f"chat-{i:02d}" for i in range(chat_models - 5, chat_models)]
        for i in range(chat_models):
            model = f"chat-{i:02d}"
            for copy in range(2 if model in doubled else 1):
                await env.horde.horde.pop(
                    env.owner,
                    {
                        "name": f"chat-worker-{i}-{copy}",
                        "models": [model],
                        "max_length": 80,
                        "max_context_length": 1024,
                        "chat_jobs": True,
                        "model_id": model,
                        "chat_limits": {"max_context_length": 1024, "max_length": 80},
                    },
                )
        pool = (await env.client.get("/dashboard/pool")).json()
    offered = pool["chat_models"]
    assert len(offered) == DASHBOARD_CHAT_MODELS
    # Most chat workers first, then by name.
    assert offered[:5] == doubled
    assert offered[5:] == [f"chat-{i:02d}" for i in range(DASHBOARD_CHAT_MODELS - 5)]
    assert pool["more_chat_models"] == chat_models - DASHBOARD_CHAT_MODELS


async def test_metrics_read_the_queue_at_most_once_a_second_however_many_scrape() -> None:
    async with open_env() as env:
        with statements(env.horde) as sent:
            start = time.monotonic()
            for _ in range(10):
                assert (await env.client.get("/metrics")).status_code == 200
            elapsed = time.monotonic() - start
    # Each read of the queue depth sends one statement of the served
    # models' grouping (the CTE named per_model).
    reads = [s for s in sent if "per_model" in s]
    assert 1 <= len(reads) <= math.ceil(elapsed / METRICS_READ_SECONDS) + 1, (len(reads), elapsed)


def _rename(old: str, new: str) -> Callable[[Connection], None]:
    def rename(conn: Tx) -> None:
        conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))

    return rename


def _counted_failures(exposition: str) -> dict[str, float]:
    return {
        s.labels["figure"]: s.value
        for family in text_string_to_metric_families(exposition)
        if family.name == "hordelite_scrape_failures"
        for s in family.samples
        if s.name == "hordelite_scrape_failures_total"
    }


async def test_a_figure_metrics_cannot_read_is_logged_once_counted_and_the_rest_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hordelite.metrics")
    async with open_env() as env:
        db = env.horde.horde.db
        # The queue table gone from under the horde: its depth cannot be read
        # (a failed read is not kept, so each scrape tries again).
        await db.write(_rename("queue", "queue_away"))
        scrapes = [(await env.client.get("/metrics")).text for _ in range(3)]
        await db.write(_rename("queue_away", "queue"))
        back = (await env.client.get("/metrics")).text
    for exposition in scrapes:
        names = {f.name for f in text_string_to_metric_families(exposition)}
        assert "hordelite_queue_depth" not in names
        # The rest still answers.
        assert {"hordelite_workers_online", "hordelite_database_up"} <= names
    assert _counted_failures(scrapes[-1]) == {"hordelite_queue_depth": 3.0}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "leaves out hordelite_queue_depth" in warnings[0]
    assert "could not be read" in warnings[0]
    assert "hordelite_queue_depth" in {f.name for f in text_string_to_metric_families(back)}
    assert any("reads hordelite_queue_depth again" in r.getMessage() for r in caplog.records)


async def test_on_postgresql_70000_served_models_still_report_the_queue_depth(
    postgres_schema_url: str,
) -> None:
    served_models = 700 * MAX_MODELS
    assert served_models > POSTGRES_MAX_PARAMETERS
    async with (
        open_horde(config=UNCAPPED, database=postgres_schema_url) as horde,
        httpx.AsyncClient(base_url=horde.url, timeout=60) as client,
    ):
        owner = await horde.create_key("owner")
        first = {"name": "pg-000", "models": [f"pg-000-{j:02d}" for j in range(MAX_MODELS)]}
        assert (await horde.horde.pop(owner, first)).job is None
        clones = {
            f"pg-{i:03d}": [f"pg-{i:03d}-{j:02d}" for j in range(MAX_MODELS)]
            for i in range(1, served_models // MAX_MODELS)
        }
        await horde.horde.db.write(clone_workers, "pg-000", clones)
        await horde.horde.core.signals.notify_pool()  # the snapshot reads the clones
        requester = await horde.create_key("alice", kudos=1000)
        await _queue(horde, requester, [f"pg-699-{j:02d}" for j in range(3)])
        with parameter_counts(horde.horde.db) as counts:
            scraped = await client.get("/metrics")
            models = await client.get("/api/v2/status/models?type=text")
            pool = await client.get("/dashboard/pool")
    assert (scraped.status_code, models.status_code, pool.status_code) == (200, 200, 200)
    # Before, the queue depth and the workers online vanished: the statement
    # naming every served model had 70,001 parameters, which psycopg refuses.
    depth = queue_depth(scraped.text)
    assert {k: v for k, v in depth.items() if v} == {
        (f"pg-699-{j:02d}", "text"): 1 for j in range(3)
    }
    # Served models with nothing waiting answer 0, as many as the cap holds.
    assert len(depth) == 2 * (METRICS_MODELS + 1)
    assert "hordelite_workers_online 700.0" in scraped.text
    assert models.headers["x-total-count"] == str(served_models)
    assert pool.json()["more_models"] == served_models - DASHBOARD_MODELS
    assert max(counts) <= FEW_PARAMETERS, max(counts)
