"""Leases, expiries, the online window, maintenance and cancel, on a moved clock."""

from __future__ import annotations

import httpx
import pytest

from hordelite.testing import ManualClock
from tests.integration._env import open_env
from tests.integration._helpers import assert_refused, worker_id

pytestmark = pytest.mark.anyio

# From the specification.
JOB_TTL = 150
REQUEST_EXPIRY = 1200
WORKER_ONLINE = 300
MAINTENANCE_ABORTS = 20  # more than this many aborts in an hour
MAX_FAULTS = 2  # more than this many faulted jobs end a request


async def test_a_job_past_its_ttl_is_requeued_and_its_late_submit_is_AbortedGen() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        slow_owner = await env.horde.create_key("slow")
        fast_owner = await env.horde.create_key("fast")
        slow = await env.text_worker("slow", key=slow_owner)
        fast = await env.text_worker("fast", key=fast_owner)
        request_id = await env.submit_text("Lease me")
        first = await slow.pop()
        assert first["id"] is not None

        clock.advance(JOB_TTL - 1)
        await env.horde.sweep()
        assert (await env.text_status(request_id))["restarted"] == 0
        assert (await fast.pop())["id"] is None  # still leased

        clock.advance(2)
        await env.horde.sweep()
        assert (await env.text_status(request_id))["restarted"] == 1
        second = await fast.pop()
        assert second["id"] not in (None, first["id"])
        assert second["payload"]["prompt"] == "Lease me"

        late = await slow.client.post(
            "/generate/text/submit",
            json={"id": first["id"], "generation": "too late", "state": "ok"},
        )
        assert_refused(late, 400, "AbortedGen")
        await fast.submit(second["id"], "in time")
        status = await env.text_status(request_id)
        assert status["done"] is True
        assert [g["worker_name"] for g in status["generations"]] == ["fast"]


async def test_a_request_whose_every_lease_lapses_ends_faulted_after_max_faults() -> None:
    """A request that crashes every worker's backend must not loop one lease
    after another: each lapse counts, and the one past the limit ends it."""
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker()
        request_id = await env.submit_text("Crash me")
        for lap in range(MAX_FAULTS + 1):
            status = await env.text_status(request_id)
            assert status["faulted"] is False, (lap, status)
            assert (await worker.pop())["id"] is not None, lap
            clock.advance(JOB_TTL + 1)
            await env.horde.sweep()
        status = await env.text_status(request_id)
        assert status["faulted"] is True, status
        assert status["fault"]["message"].endswith("before its job's lease ran out."), status
        assert (await worker.pop())["id"] is None  # nothing left to loop on


async def test_a_request_nobody_pops_expires_request_expiry_after_creation() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker()
        request_id = await env.submit_text("Anyone?")
        clock.advance(REQUEST_EXPIRY - 1)
        await env.horde.sweep()
        assert (await env.text_status(request_id))["faulted"] is False
        clock.advance(2)
        await env.horde.sweep()
        assert (await env.text_status(request_id))["faulted"] is True
        assert (await worker.pop())["id"] is None


async def test_a_request_expires_request_expiry_after_its_last_pop() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker()
        request_id = await env.submit_text("Try me")
        clock.advance(1000)
        job = await worker.pop()  # pushes the expiry to 1000 + REQUEST_EXPIRY
        await worker.submit(job["id"], "", state="faulted")  # back in the queue
        clock.advance(REQUEST_EXPIRY - 100)  # past creation + expiry
        await env.horde.sweep()
        assert (await env.text_status(request_id))["faulted"] is False
        clock.advance(101)  # past last pop + expiry
        await env.horde.sweep()
        assert (await env.text_status(request_id))["faulted"] is True
        assert (await worker.pop())["id"] is None


async def test_a_worker_is_online_for_300_seconds_after_its_last_pop() -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker("w-online")
        await worker.pop()
        wid = await worker_id(env.client, "w-online")
        clock.advance(WORKER_ONLINE - 1)
        assert (await env.client.get(f"/api/v2/workers/{wid}")).json()["online"] is True
        clock.advance(2)
        assert (await env.client.get(f"/api/v2/workers/{wid}")).json()["online"] is False


async def test_over_20_aborts_in_an_hour_mean_maintenance_until_the_owner_clears_it() -> None:
    clock = ManualClock()
    faulted_submits = 11
    lease_expiries = MAINTENANCE_ABORTS + 1 - faulted_submits
    async with open_env(clock=clock) as env:
        other = await env.horde.create_key("mallory")
        worker = await env.text_worker("flaky")
        for i in range((faulted_submits + lease_expiries) // (MAX_FAULTS + 1) + 1):
            await env.submit_text(f"request {i}")
        start = clock.now()
        # Every pop up to the 21st abort is served: 20 aborts are tolerated.
        for _ in range(faulted_submits):
            job = await worker.pop()
            assert job["id"] is not None
            await worker.submit(job["id"], "", state="faulted")
        for _ in range(lease_expiries):
            job = await worker.pop()
            assert job["id"] is not None
            clock.advance(JOB_TTL + 1)
            await env.horde.sweep()
        assert clock.now() - start < 3600  # all within the hour

        refused = await worker.client.post("/generate/text/pop", json=worker.pop_body())
        assert_refused(refused, 403, "WorkerMaintenance")
        wid = await worker_id(env.client, "flaky")
        assert (await env.client.get(f"/api/v2/workers/{wid}")).json()["maintenance_mode"] is True

        put = await env.client.put(
            f"/api/v2/workers/{wid}", headers={"apikey": other}, json={"maintenance": False}
        )
        assert_refused(put, 403, "WrongCredentials")
        refused = await worker.client.post("/generate/text/pop", json=worker.pop_body())
        assert_refused(refused, 403, "WorkerMaintenance")

        put = await env.client.put(
            f"/api/v2/workers/{wid}", headers={"apikey": env.owner}, json={"maintenance": False}
        )
        assert put.status_code == 200, put.text
        assert (await worker.pop())["id"] is not None


async def test_cancel_stops_popping_and_a_job_in_flight_is_still_submitted_and_rewarded() -> None:
    async with open_env() as env:
        worker = await env.text_worker()
        request_id = await env.submit_text("Never mind", n=2)
        job = await worker.pop()
        assert job["id"] is not None
        cancel = await env.client.delete(f"/api/v2/generate/text/status/{request_id}")
        assert cancel.status_code == 200, cancel.text
        assert (await worker.pop())["id"] is None
        # Worker guide, step 7: a job that does not stream is not settled at the
        # cancel; submitted as usual, it is rewarded for its reply.
        late = await worker.client.post(
            "/generate/text/submit",
            json={"id": job["id"], "generation": "unwanted", "state": "ok"},
        )
        assert late.status_code == 200, late.text
        assert late.json()["reward"] > 0
        status = (await env.client.get(f"/api/v2/generate/text/status/{request_id}")).json()
        assert [g["text"] for g in status["generations"]] == ["unwanted"]
        assert status["done"] is True


async def test_put_worker_answers_what_it_changed_and_clearing_maintenance_resets_aborts_in_window() -> (
    None
):
    async with open_env() as env:
        worker = await env.text_worker("w")
        async with httpx.AsyncClient(
            base_url=env.horde.url, headers={"apikey": env.owner}
        ) as client:
            await worker.pop()
            path = f"/api/v2/workers/{await worker_id(client, 'w')}"
            put = await client.put(path, json={"maintenance": True})
            assert (put.status_code, put.json()) == (200, {"maintenance": True})
            put = await client.put(path, json={"maintenance": False})
            assert (put.status_code, put.json()) == (
                200,
                {"maintenance": False, "aborts_in_window": 0},
            )
            put = await client.put(path, json={"info": "kept"})
            assert (put.status_code, put.json()) == (200, {"info": "kept"})
