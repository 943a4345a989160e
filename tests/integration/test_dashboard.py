"""The dashboard at / without a browser: the server-rendered page, its
headers, the switch that turns it off, and the figures of its one JSON route
(/dashboard/activity). tests/integration/test_dashboard_browser.py drives the
page in Chromium."""

from __future__ import annotations

from typing import Any

import pytest
from markupsafe import escape
from sqlalchemy import func, select

from hordelite.clock import ManualClock
from hordelite.config import Config
from hordelite.contract.kudos import billed_tokens
from hordelite.contract.limits import DASHBOARD_CACHE_SECONDS
from hordelite.storage.schema import activity_minutes, jobs
from hordelite.storage.transaction import Tx
from hordelite.testing import FakeTextWorker
from tests.integration._chat_helpers import MODEL, STRICT, ChatEnv, open_chat_horde, pop_job
from tests.integration._env import open_env
from tests.integration._helpers import statements

pytestmark = pytest.mark.anyio

HOSTILE_WORKER = "<img src=x onerror=alert(1)>"
HOSTILE_MODEL = 'm"><script>alert(2)</script>'


async def test_the_page_shows_models_and_workers_with_every_name_as_escaped_text() -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("honest-worker", STRICT)
        await env.chat_worker(HOSTILE_WORKER, STRICT, model_id=HOSTILE_MODEL)
        response = await env.client.get("/")
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/html")
        page = response.text
        assert "honest-worker" in page
        assert MODEL in page
        # The playground offers the chat models served now.
        assert f'<option value="{MODEL}">{MODEL}</option>' in page
        for name in (HOSTILE_WORKER, HOSTILE_MODEL):
            assert name not in page
            assert str(escape(name)) in page
        assert "<script>alert" not in page
        assert "<img src=x" not in page
        # The only script is the static file (the Content-Security-Policy allows no other).
        assert page.count("<script") == 1
        assert '<script src="/dashboard/static/dashboard.js" defer></script>' in page


async def test_the_page_its_files_and_its_figures_carry_a_strict_csp_and_nosniff() -> None:
    async with open_chat_horde() as env:
        for path, kind in (
            ("/", "text/html"),
            ("/dashboard/static/dashboard.js", "text/javascript"),
            ("/dashboard/static/dashboard.css", "text/css"),
            ("/dashboard/activity", "application/json"),
        ):
            response = await env.client.get(path)
            assert response.status_code == 200, (path, response.text)
            assert response.headers["content-type"].startswith(kind), path
            assert response.headers["x-content-type-options"] == "nosniff", path
            csp = response.headers["content-security-policy"]
            assert "default-src 'none'" in csp, path
            assert "script-src 'self';" in csp, path
            assert "unsafe-inline" not in csp, path
            assert "unsafe-eval" not in csp, path
            assert "frame-ancestors 'none'" in csp, path
            assert response.headers["referrer-policy"] == "no-referrer", path


async def test_with_the_dashboard_off_its_routes_are_refused_in_the_json_envelope_and_the_rest_serves() -> (
    None
):
    config = Config().replace(dashboard={"enabled": False})
    async with open_env(config=config) as env:
        for path in ("/dashboard/activity", "/dashboard/static/dashboard.js"):
            response = await env.client.get(path)
            assert response.status_code == 404, path
            assert response.json()["rc"] == "NotFound", path
        # The root answers only HEAD (a client's probe) without the page.
        response = await env.client.get("/")
        assert response.status_code == 405
        assert response.json()["rc"] == "MethodNotAllowed"
        assert (await env.client.head("/")).status_code == 200
        assert (await env.client.get("/api/v2/status/heartbeat")).status_code == 200


async def _done_text_job(
    env: ChatEnv, clock: ManualClock, worker: FakeTextWorker, generation: str, seconds: float
) -> None:
    """Queue a text request now, pop it, let ``seconds`` pass, submit ``generation``."""
    await env.submit_text(max_length=80)
    job = await pop_job(worker)
    clock.advance(seconds)
    await worker.submit(job["id"], generation)


@pytest.mark.usefixtures("chat_database")
async def test_activity_counts_the_done_jobs_their_tokens_and_mean_latency_per_minute() -> None:
    clock = ManualClock(1_800_000_000.0)  # a minute boundary
    t0 = clock.now()
    async with open_chat_horde(clock=clock, retention=3600) as env:
        worker = await env.text_worker("counter")
        # Minute 0: one job, 35 s from the request's submit to the job's (done
        # past the minute's middle: a bucket index rounded, not floored, is wrong).
        clock.advance(5)
        await _done_text_job(env, clock, worker, "a" * 40, 35)
        # Minute 1: two jobs of 4 s and 2 s, and a faulted one that is not counted.
        clock.advance(25)
        await _done_text_job(env, clock, worker, "b" * 100, 4)
        await _done_text_job(env, clock, worker, "c" * 8, 2)
        await env.submit_text(max_length=80)
        faulted = await pop_job(worker)
        await worker.submit(faulted["id"], "", state="faulted")
        assert clock.now() == t0 + 71

        response = await env.client.get("/dashboard/activity")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["bucket_seconds"] == 60
        assert body["window_seconds"] == 3600
        buckets = body["buckets"]
        assert len(buckets) == 60
        # The last bucket is the current minute; the window ends at its end.
        assert buckets[-1]["start"] == t0 + 60
        assert [b["start"] for b in buckets] == [t0 + 60 - 60 * (59 - i) for i in range(60)]
        assert buckets[-2] == {
            "start": t0,
            "jobs": 1,
            "tokens": billed_tokens(40, 80),
            "latency": 35.0,
        }
        assert buckets[-1] == {
            "start": t0 + 60,
            "jobs": 2,
            "tokens": billed_tokens(100, 80) + billed_tokens(8, 80),
            "latency": 3.0,
        }
        assert all(
            b == {"start": b["start"], "jobs": 0, "tokens": 0, "latency": None}
            for b in buckets[:-2]
        )

        # Read at most once per cache period: a job done now shows a period later.
        await _done_text_job(env, clock, worker, "d" * 40, 0)
        assert (await env.client.get("/dashboard/activity")).json() == body
        clock.advance(DASHBOARD_CACHE_SECONDS - 0.5)
        assert (await env.client.get("/dashboard/activity")).json() == body
        clock.advance(0.5)
        later = (await env.client.get("/dashboard/activity")).json()
        assert later["buckets"][-1]["jobs"] == 3


def _rollup(conn: Tx) -> dict[float, tuple[int, int, float]]:
    rows = conn.execute(select(activity_minutes)).all()
    return {float(m): (int(n), int(t), float(s)) for m, n, t, s in rows}


def _stored_done_jobs(conn: Tx) -> int:
    return int(conn.execute(select(func.count()).where(jobs.c.state == "done")).scalar_one())


async def _busy_minutes(env: ChatEnv) -> dict[float, dict[str, Any]]:
    """The activity's buckets that saw a job, by start; checks the window is the hour."""
    body = (await env.client.get("/dashboard/activity")).json()
    assert body["window_seconds"] == 3600
    assert len(body["buckets"]) == 60
    return {b["start"]: b for b in body["buckets"] if b["jobs"]}


@pytest.mark.usefixtures("chat_database")
async def test_activity_covers_the_hour_past_the_retention_from_the_jobs_the_purge_rolled_up() -> (
    None
):
    clock = ManualClock(1_800_000_000.0)  # a minute boundary
    t0 = clock.now()
    async with open_chat_horde(clock=clock, retention=600) as env:
        db = env.horde.horde.db
        worker = await env.text_worker("counter")
        # Minute 0: jobs done at t0 + 10 (5 s after their request) and t0 + 50 (20 s).
        clock.advance(5)
        await _done_text_job(env, clock, worker, "a" * 40, 5)
        clock.advance(20)
        await _done_text_job(env, clock, worker, "b" * 100, 20)
        # Minute 1: one done at t0 + 72 (2 s).
        clock.advance(20)
        await _done_text_job(env, clock, worker, "c" * 8, 2)
        assert clock.now() == t0 + 72
        minute_0 = {
            "start": t0,
            "jobs": 2,
            "tokens": billed_tokens(40, 80) + billed_tokens(100, 80),
            "latency": 12.5,
        }
        minute_1 = {"start": t0 + 60, "jobs": 1, "tokens": billed_tokens(8, 80), "latency": 2.0}
        assert await _busy_minutes(env) == {t0: minute_0, t0 + 60: minute_1}

        # Past the retention of the first request only: minute 0 is half
        # rolled up, half stored, and reads the same.
        clock.advance(630 - 72)
        await env.horde.sweep()
        assert await db.read(_stored_done_jobs) == 2
        assert await db.read(_rollup) == {t0: (1, billed_tokens(40, 80), 5.0)}
        assert await _busy_minutes(env) == {t0: minute_0, t0 + 60: minute_1}

        # Every job purged: a later sweep adds to minute 0's row.
        clock.advance(70)
        await env.horde.sweep()
        assert await db.read(_stored_done_jobs) == 0
        assert await db.read(_rollup) == {
            t0: (2, minute_0["tokens"], 25.0),
            t0 + 60: (1, billed_tokens(8, 80), 2.0),
        }
        assert await _busy_minutes(env) == {t0: minute_0, t0 + 60: minute_1}

        # Minute 20: a job done at t0 + 1217 (7 s), stored beside the rollup.
        clock.advance(1210 - 700)
        await _done_text_job(env, clock, worker, "d" * 60, 7)
        minute_20 = {
            "start": t0 + 1200,
            "jobs": 1,
            "tokens": billed_tokens(60, 80),
            "latency": 7.0,
        }
        busy = await _busy_minutes(env)
        assert busy == {t0: minute_0, t0 + 60: minute_1, t0 + 1200: minute_20}

        # An hour on, minute 0 has left the window and its row is deleted;
        # minute 1 is the window's first bucket.
        clock.advance(3610 - 1217)
        await env.horde.sweep()
        assert await db.read(_stored_done_jobs) == 0
        assert await db.read(_rollup) == {
            t0 + 60: (1, billed_tokens(8, 80), 2.0),
            t0 + 1200: (1, billed_tokens(60, 80), 7.0),
        }
        body = (await env.client.get("/dashboard/activity")).json()
        assert body["buckets"][0]["start"] == t0 + 60
        assert await _busy_minutes(env) == {t0 + 60: minute_1, t0 + 1200: minute_20}


async def test_activity_takes_no_input_and_writes_nothing() -> None:
    async with open_chat_horde() as env:
        for method in ("POST", "PUT", "DELETE"):
            response = await env.client.request(method, "/dashboard/activity")
            assert response.status_code == 405, method
        # Only the shipped files are served.
        response = await env.client.get("/dashboard/static/%2e%2e/dashboard.py")
        assert response.status_code == 404
        # A query string changes nothing, and a read writes nothing.
        with statements(env.horde) as sent:
            plain = await env.client.get("/dashboard/activity")
            other = await env.client.get("/dashboard/activity?window=999999")
        assert (plain.status_code, other.status_code) == (200, 200), (plain.text, other.text)
        assert len(plain.json()["buckets"]) == 60
        assert other.json() == plain.json()
        assert any(s.lstrip().upper().startswith("SELECT") for s in sent), sent
        writes = ("INSERT", "UPDATE", "DELETE")
        assert not [s for s in sent if s.lstrip().upper().startswith(writes)], sent
