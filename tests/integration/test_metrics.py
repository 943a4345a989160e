"""``GET /metrics`` over real HTTP: after a known sequence of requests, the
exposition (parsed with prometheus_client's own parser) holds the exact
counts: pops, faults, progress posts, requests by route and status,
refusals by rc, latency histograms, queue depth, workers and threads
online, and the kudos the ledger moved. ``[metrics] enabled = false``
answers 404; ``[metrics] port`` serves /metrics alone on a port of its own.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hordelite import __version__
from hordelite.config import Config
from hordelite.contract.limits import READY_CHECK_SECONDS
from hordelite.server import open_server
from hordelite.testing import FakeTextWorker, ManualClock, open_horde
from tests.integration._chat_helpers import (
    MODEL,
    ChatEnv,
    chat_body,
    open_chat_horde,
    pop_job,
)
from tests.integration._env import open_env
from tests.integration._helpers import RedisServer, eventually, relayed

pytestmark = pytest.mark.anyio

FRONT = "/v1/chat/completions"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of the exposition by (name, sorted labels)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; 0 for a labelled series never counted."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)


async def front_call(env: ChatEnv, worker: Any, *, stream: bool) -> list[str]:
    """An OpenAI call, served meanwhile by ``worker``; the answer's lines."""
    lines: list[str] = []

    async def call() -> None:
        body = {**chat_body("Name one colour."), "stream": stream}
        headers = {"Authorization": f"Bearer {env.requester}"}
        async with env.client.stream("POST", FRONT, headers=headers, json=body) as response:
            assert response.status_code == 200
            lines.extend([line async for line in response.aiter_lines() if line])

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        assert await worker.serve_one(wait=10) is not None
    return lines


def http(samples: Samples, route: str, method: str, status: int) -> float:
    return value(
        samples, "hordelite_http_requests_total", route=route, method=method, status=str(status)
    )


async def test_metrics_count_a_known_sequence_exactly(
    anyio_backend: str, chat_database: str | None
) -> None:
    async with open_chat_horde() as env:
        start_requester = await env.kudos()
        worker = await env.chat_worker("w1")  # one empty pop
        # A non-streamed and a streamed OpenAI call, each a chat job served.
        await front_call(env, worker, stream=False)
        lines = await front_call(env, worker, stream=True)
        assert lines[-1] == "data: [DONE]"
        # A native streamed chat request: its job, one progress post, the reply.
        await env.queue(chat_body(stream=True))
        job = await pop_job(worker)
        posted = await worker.client.post(
            "/generate/text/progress", json={"id": job["id"], "seq": 1, "delta": {"content": "B"}}
        )
        assert posted.status_code == 200, posted.text
        reply = await worker.submit_reply(job, worker.reply(job))
        assert reply.status_code == 200, reply.text
        # Three text requests: one served, one faulted (back to the queue).
        for _ in range(3):
            await env.submit_text(max_length=16)
        job = await pop_job(worker)
        await worker.submit(job["id"], "there was", seed=1)
        job = await pop_job(worker)
        await worker.submit(job["id"], "", state="faulted")
        # A refused submit (400 naming the field), and a path no route has.
        refused = await env.client.post(
            "/api/v2/generate/text/async", headers={"apikey": env.requester}, json={"prompt": 5}
        )
        assert refused.status_code == 400, refused.text
        assert (await env.client.get("/api/v2/no/such/route/1234")).status_code == 404

        # The stream's end is counted when its body has ended on the server.
        async def front_counted() -> bool:
            found = await scrape(env.client)
            return value(found, "hordelite_front_call_seconds_count", stream="true") == 1

        await eventually(front_counted)
        samples = await scrape(env.client)
        spent = start_requester - await env.kudos()
        earned = await env.kudos(env.owner)

    assert value(samples, "hordelite_pops_total", outcome="job") == 5
    assert value(samples, "hordelite_pops_total", outcome="empty") == 1
    assert value(samples, "hordelite_faults_total", reason="none") == 1
    assert value(samples, "hordelite_progress_posts_total") == 1
    assert value(samples, "hordelite_request_latency_seconds_count", kind="chat") == 3
    assert value(samples, "hordelite_request_latency_seconds_count", kind="text") == 1
    assert value(samples, "hordelite_front_call_seconds_count", stream="false") == 1
    assert value(samples, "hordelite_front_call_seconds_count", stream="true") == 1
    assert value(samples, "hordelite_sse_streams_open") == 0
    # Two text jobs wait: the untouched one and the faulted one's requeue.
    assert value(samples, "hordelite_queue_depth", model=MODEL, kind="text") == 2
    assert value(samples, "hordelite_queue_depth", model=MODEL, kind="chat") == 0
    assert value(samples, "hordelite_workers_online") == 1
    assert value(samples, "hordelite_threads_online") == 1
    assert value(samples, "hordelite_database_up") == 1
    assert value(samples, "hordelite_database_round_trip_seconds") > 0
    # The ledger, as the user routes show it (rounded to the hundredth).
    assert spent > 0
    assert value(samples, "hordelite_kudos_charged_total") == pytest.approx(spent, abs=0.01)
    assert value(samples, "hordelite_kudos_rewarded_total") == pytest.approx(earned, abs=0.01)
    # Requests by route template, method and status.
    assert http(samples, "/api/v2/generate/text/async", "POST", 202) == 3
    assert http(samples, "/api/v2/generate/text/async", "POST", 400) == 1
    assert http(samples, "/api/v2/generate/chat/async", "POST", 202) == 1
    assert http(samples, "/api/v2/generate/text/pop", "POST", 200) == 6
    assert http(samples, "/api/v2/generate/text/submit", "POST", 200) == 5
    assert http(samples, "/api/v2/generate/text/progress", "POST", 200) == 1
    assert http(samples, FRONT, "POST", 200) == 2
    assert http(samples, "unmatched", "GET", 404) == 1
    assert value(samples, "hordelite_refusals_total", rc="NotFound") == 1
    assert sum(v for (name, _), v in samples.items() if name == "hordelite_refusals_total") == 2


async def test_the_route_label_of_unknown_paths_is_one_label(anyio_backend: str) -> None:
    async with open_env() as env:
        for n in range(5):
            assert (await env.client.get(f"/nothing/{n}")).status_code == 404
        assert (await env.client.get("/api/v2/workers/name/nobody")).status_code == 404
        samples = await scrape(env.client)
    routes = {
        dict(labels)["route"]
        for (name, labels), _ in samples.items()
        if name == "hordelite_http_requests_total"
    }
    assert routes == {"unmatched", "/api/v2/workers/name/<path:name>"}
    assert http(samples, "unmatched", "GET", 404) == 5


async def test_metrics_turned_off_answer_404_in_the_horde_envelope(anyio_backend: str) -> None:
    config = Config().replace(metrics={"enabled": False})
    async with open_env(config=config) as env:
        response = await env.client.get("/metrics")
        assert env.horde.metrics_url is None
    assert response.status_code == 404
    assert response.json()["rc"] == "NotFound"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_metrics_on_a_port_of_their_own_count_the_horde_port(anyio_backend: str) -> None:
    config = Config().replace(metrics={"port": free_port()})
    async with open_env(config=config) as env:
        assert env.horde.metrics_url is not None
        async with httpx.AsyncClient(base_url=env.horde.metrics_url) as metrics:
            assert (await env.client.get("/api/v2/status/heartbeat")).status_code == 200
            main_port = await env.client.get("/metrics")
            samples = await scrape(metrics)
            other = await metrics.get("/api/v2/status/heartbeat")
    assert main_port.status_code == 404
    assert main_port.json()["rc"] == "NotFound"
    assert http(samples, "/api/v2/status/heartbeat", "GET", 200) == 1
    assert other.status_code == 404
    assert other.json()["rc"] == "NotFound"


async def test_the_metrics_port_listens_on_127_0_0_1_even_when_the_horde_listens_on_every_address(
    anyio_backend: str, tmp_path: Path
) -> None:
    # 127.0.0.2 is another address of this machine (Linux routes all of
    # 127/8 to the loopback): a socket bound to 127.0.0.1 refuses it, one
    # bound to 0.0.0.0 answers it.
    port = free_port()
    config = Config().replace(
        server={"host": "0.0.0.0", "port": 0, "grace_period": 2},
        storage={"database": str(tmp_path / "horde.db")},
        metrics={"port": port},
    )
    # open_server itself: open_horde listens on 127.0.0.1 whatever the config says.
    async with open_server(config) as horde:
        horde_port = horde.url.rsplit(":", 1)[1]
        assert horde.metrics_url == f"http://127.0.0.1:{port}"  # the listening socket's address
        async with httpx.AsyncClient(timeout=5) as client:
            # The control: the horde's own port answers on the other address.
            other = await client.get(f"http://127.0.0.2:{horde_port}/api/v2/status/heartbeat")
            assert other.status_code == 200
            assert (await client.get(f"http://127.0.0.1:{port}/metrics")).status_code == 200
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.2:{port}/metrics")


async def test_metrics_host_puts_the_metrics_port_on_another_address(anyio_backend: str) -> None:
    port = free_port()
    config = Config().replace(metrics={"port": port, "host": "127.0.0.2"})
    async with open_horde(config=config) as horde, httpx.AsyncClient(timeout=5) as client:
        assert horde.metrics_url == f"http://127.0.0.2:{port}"
        assert (await client.get(f"http://127.0.0.2:{port}/metrics")).status_code == 200
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/metrics")


async def test_an_open_stream_is_counted_until_its_client_leaves(anyio_backend: str) -> None:
    async with open_chat_horde() as env:
        await env.chat_worker("w1")  # online, never serving: the stream waits
        body = {**chat_body("Name one colour."), "stream": True}
        headers = {"Authorization": f"Bearer {env.requester}"}
        async with env.client.stream("POST", FRONT, headers=headers, json=body) as response:
            assert response.status_code == 200  # the headers are out: the stream is open
            during = await scrape(env.client)

        async def closed() -> bool:
            return value(await scrape(env.client), "hordelite_sse_streams_open") == 0

        await eventually(closed)
        after = await scrape(env.client)
    assert value(during, "hordelite_sse_streams_open") == 1
    assert value(during, "hordelite_front_call_seconds_count", stream="true") == 0
    assert value(after, "hordelite_front_call_seconds_count", stream="true") == 1


async def test_the_kudos_a_cancel_settles_are_counted(anyio_backend: str) -> None:
    async with open_chat_horde() as env:
        start = await env.kudos()
        worker = await env.chat_worker("w1")
        request_id = await env.queue(chat_body(stream=True))
        job = await pop_job(worker)
        posted = await worker.client.post(
            "/generate/text/progress",
            json={"id": job["id"], "seq": 1, "delta": {"content": "Blue is a colour. " * 20}},
        )
        assert posted.status_code == 200, posted.text
        cancelled = await env.client.delete(f"/api/v2/generate/chat/status/{request_id}")
        assert cancelled.status_code == 200, cancelled.text
        samples = await scrape(env.client)
        spent = start - await env.kudos()
        earned = await env.kudos(env.owner)
    assert earned > 0
    assert value(samples, "hordelite_kudos_charged_total") == pytest.approx(spent, abs=0.01)
    assert value(samples, "hordelite_kudos_rewarded_total") == pytest.approx(earned, abs=0.01)
    assert value(samples, "hordelite_request_latency_seconds_count", kind="chat") == 0


async def test_a_lease_that_runs_out_is_a_fault_by_lease_expired(anyio_backend: str) -> None:
    clock = ManualClock()
    async with open_env(clock=clock) as env:
        worker = await env.text_worker("w")
        await env.submit_text("Lease me")
        assert (await worker.pop())["id"] is not None
        clock.advance(env.horde.horde.config.horde.job_ttl + 1)
        await env.horde.sweep()
        samples = await scrape(env.client)
    assert value(samples, "hordelite_faults_total", reason="lease_expired") == 1
    assert value(samples, "hordelite_queue_depth", model="m1", kind="text") == 1


async def test_redis_round_trips_are_measured_only_with_redis_signals(anyio_backend: str) -> None:
    redis_url = os.environ.get("HORDELITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    with_redis = Config().replace(signals={"url": redis_url})
    async with open_horde(config=with_redis) as horde:
        async with httpx.AsyncClient(base_url=horde.url) as client:
            samples = await scrape(client)
    assert value(samples, "hordelite_redis_up") == 1
    assert value(samples, "hordelite_redis_round_trip_seconds") > 0
    local = Config().replace(signals={"url": ""})
    async with open_horde(config=local) as horde:
        async with httpx.AsyncClient(base_url=horde.url) as client:
            samples = await scrape(client)
    assert not [name for name, _ in samples if name.startswith("hordelite_redis_")]


async def test_queue_depth_labels_only_the_models_an_online_worker_serves(
    anyio_backend: str,
) -> None:
    # Clients name models freely: a request for 60 names nobody serves adds
    # one job to model="unserved", never 60 series of the client's choosing.
    made_up = [f"made-up-{i}" for i in range(60)]
    async with open_env(requester_kudos=1000) as env:
        worker = await env.text_worker("w")
        assert (await worker.pop())["id"] is None  # online, the queue empty
        await env.submit_text("Nobody serves these", models=made_up)
        await env.submit_text("Served and not", models=["m1", *made_up])
        await env.submit_text("Any model at all", models=())
        samples = await scrape(env.client)
    depth = {
        labels: jobs for (name, labels), jobs in samples.items() if name == "hordelite_queue_depth"
    }
    assert depth == {
        (("kind", "text"), ("model", "any")): 1,
        (("kind", "text"), ("model", "m1")): 1,
        (("kind", "chat"), ("model", "m1")): 0,  # served, nothing waiting
        (("kind", "text"), ("model", "unserved")): 1,
    }


async def test_a_served_model_with_nothing_waiting_has_a_queue_depth_of_0(
    anyio_backend: str,
) -> None:
    async with open_env() as env:
        before = await scrape(env.client)  # no worker: no model to label
        async with FakeTextWorker(
            env.horde.url, env.owner, name="w", models=["m1", "m2"]
        ) as worker:
            assert (await worker.pop())["id"] is None  # online, the queue empty
            samples = await scrape(env.client)
    assert not [name for name, _ in before if name == "hordelite_queue_depth"]
    depth = {
        labels: jobs for (name, labels), jobs in samples.items() if name == "hordelite_queue_depth"
    }
    assert depth == {
        (("kind", kind), ("model", model)): 0 for model in ("m1", "m2") for kind in ("text", "chat")
    }


async def test_the_build_and_this_process_are_described(anyio_backend: str) -> None:
    async with open_env() as env:
        samples = await scrape(env.client)
    assert value(samples, "hordelite_build_info", version=__version__) == 1
    assert [labels for name, labels in samples if name == "hordelite_build_info"] == [
        (("version", __version__),)
    ]
    # prometheus_client's process collector, on the horde's own registry:
    # this process's figures, read from /proc.
    assert value(samples, "process_resident_memory_bytes") > 0
    assert value(samples, "process_open_fds") > 0
    assert value(samples, "process_start_time_seconds") > 0
    assert value(samples, "process_cpu_seconds_total") > 0


async def test_a_scrape_while_redis_is_down_answers_with_redis_up_0(anyio_backend: str) -> None:
    redis = RedisServer()
    redis.start()
    try:
        config = Config().replace(signals={"url": redis.url})
        async with open_horde(config=config) as horde:
            async with httpx.AsyncClient(base_url=horde.url) as client:
                assert value(await scrape(client), "hordelite_redis_up") == 1
                redis.kill()
                samples = await scrape(client)
    finally:
        redis.kill()
    assert value(samples, "hordelite_redis_up") == 0
    assert ("hordelite_redis_round_trip_seconds", ()) not in samples
    assert value(samples, "hordelite_database_up") == 1  # the rest still scraped


async def test_signals_degraded_is_1_while_redis_hangs_and_the_scrape_does_not_wait_on_it(
    anyio_backend: str,
) -> None:
    """A SIGSTOPped Redis answers nothing: once the horde knows (its circuit
    is open), a scrape answers at once, with hordelite_signals_degraded 1
    and hordelite_redis_up 0; 0 again once Redis continues."""
    redis = RedisServer()
    redis.start()
    try:
        config = Config().replace(signals={"url": redis.url})
        async with open_horde(config=config) as horde:
            async with httpx.AsyncClient(base_url=horde.url, timeout=30) as client:
                samples = await scrape(client)
                assert ("hordelite_signals_degraded", ()) in samples
                assert value(samples, "hordelite_signals_degraded") == 0
                redis.stop()
                await horde.horde.signals.touch_request("r")  # finds Redis hung
                assert horde.horde.signals.degraded
                start = time.monotonic()
                samples = await scrape(client)
                took = time.monotonic() - start
                assert took < READY_CHECK_SECONDS / 4, took
                assert value(samples, "hordelite_signals_degraded") == 1
                assert value(samples, "hordelite_redis_up") == 0
                redis.cont()

                async def recovered() -> bool:
                    samples = await scrape(client)
                    return value(samples, "hordelite_signals_degraded") == 0

                await eventually(recovered, within=15)
                assert value(await scrape(client), "hordelite_redis_up") == 1
    finally:
        redis.kill()
    local = Config().replace(signals={"url": ""})
    async with open_horde(config=local) as horde:
        async with httpx.AsyncClient(base_url=horde.url) as client:
            assert ("hordelite_signals_degraded", ()) not in await scrape(client)


@pytest.mark.postgres
async def test_a_scrape_while_the_database_is_down_answers_with_database_up_0(
    anyio_backend: str, postgres_schema_url: str
) -> None:
    async with relayed(postgres_schema_url) as (relay, url):
        async with (
            open_horde(database=url) as horde,
            httpx.AsyncClient(base_url=horde.url, timeout=30) as client,
        ):
            assert value(await scrape(client), "hordelite_database_up") == 1
            relay.cut()
            with anyio.fail_after(15):
                samples = await scrape(client)
    assert value(samples, "hordelite_database_up") == 0
    names = {name for name, _ in samples}
    # No figure read from the database it could not reach.
    assert not names & {
        "hordelite_database_round_trip_seconds",
        "hordelite_queue_depth",
        "hordelite_workers_online",
    }
    assert "hordelite_http_requests_total" in names  # the counted metrics still answer
