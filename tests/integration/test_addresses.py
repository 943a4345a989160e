"""Timeouts and blocks by address over real HTTP, on SQLite and PostgreSQL:
refused at submit (native text and chat), at pop and on the OpenAI fronts,
with nothing stored; ranges and the /64 rule; lapse on the horde's clock;
growing timeouts from repeated refusals; the admins' routes and the audit
trail; enforcement across replicas without Redis.

The horde trusts 127.0.0.1 (the tests' own address) as a proxy, so each
client presents the address it is given in X-Forwarded-For."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import openai
import pytest
from sqlalchemy import func, select

from hordelite.config import Config
from hordelite.contract.audit_query import AuditQuery
from hordelite.contract.limits import ADDRESS_RULES_SECONDS
from hordelite.storage.schema import requests, workers
from hordelite.testing import FakeChatWorker, FakeTextWorker, ManualClock, TestHorde, open_horde
from tests.integration._env import TLS
from tests.integration._helpers import eventually, statements

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings(
        "ignore:Async generator '(openai|httpx|httpcore)\\.:ResourceWarning"
    ),
]

ANON = "0000000000"
TEXT_ASYNC = "/api/v2/generate/text/async"
CHAT_ASYNC = "/api/v2/generate/chat/async"
IPADDR = "/api/v2/operations/ipaddr"
TEXT_MODEL = "m"
CHAT_MODEL = "chat-model"

# Far below the 2 s a replica waits at most to look again, times the
# slowest machine's margin: a replica that never looks fails the test.
REPLICA_DEADLINE = 10 * ADDRESS_RULES_SECONDS


def behind_proxy(**moderation: Any) -> Config:
    config = Config().replace(server={"trusted_proxies": "127.0.0.1"})
    return config.replace(moderation=moderation) if moderation else config


def text_body() -> dict[str, Any]:
    return {"prompt": "Hello", "params": {"max_length": 16}, "models": [TEXT_MODEL]}


def chat_body() -> dict[str, Any]:
    return {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}


class From:
    """Clients of one horde presenting one address (X-Forwarded-For)."""

    def __init__(self, horde: TestHorde, address: str, key: str) -> None:
        self.horde, self.address, self.key = horde, address, key
        self.http = httpx.AsyncClient(
            base_url=horde.url,
            verify=TLS,
            timeout=30,
            headers={"X-Forwarded-For": address, "apikey": key},
        )

    async def text(self) -> httpx.Response:
        return await self.http.post(TEXT_ASYNC, json=text_body())

    async def chat(self) -> httpx.Response:
        return await self.http.post(CHAT_ASYNC, json=chat_body())

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.horde.url + "/v1",
            api_key=self.key,
            max_retries=0,
            default_headers={"X-Forwarded-For": self.address},
            http_client=httpx.AsyncClient(verify=TLS, timeout=30),
        )


@contextlib.asynccontextmanager
async def clients(horde: TestHorde, key: str, *addresses: str) -> AsyncIterator[list[From]]:
    made = [From(horde, a, key) for a in addresses]
    try:
        yield made
    finally:
        for c in made:
            await c.http.aclose()


async def admin_of(horde: TestHorde, address: str = "192.0.2.200") -> httpx.AsyncClient:
    key = await horde.create_key("root", admin=True)
    return httpx.AsyncClient(
        base_url=horde.url,
        verify=TLS,
        timeout=30,
        headers={"apikey": key, "X-Forwarded-For": address},
    )


def assert_timed_out(response: httpx.Response, says: str = "more seconds") -> None:
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["rc"] == "TimeoutIP"
    assert says in body["message"]


async def stored_requests(horde: TestHorde) -> int:
    def count(conn: Any) -> int:
        return int(conn.execute(select(func.count()).select_from(requests)).scalar())

    return await horde.horde.db.read(count)


async def refused_pop(worker: FakeTextWorker) -> httpx.Response:
    with pytest.raises(httpx.HTTPStatusError) as caught:
        await worker.pop()
    return caught.value.response


async def test_a_timed_out_address_is_refused_at_submit_pop_and_on_v1_and_another_is_not(
    database: str | None,
) -> None:
    clock = ManualClock()
    async with open_horde(config=behind_proxy(), clock=clock, database=database) as horde:
        key = await horde.create_key("alice", kudos=1000)
        owner = await horde.create_key("bob")
        admin = await admin_of(horde)
        async with (
            admin,
            clients(horde, key, "203.0.113.7", "203.0.113.8") as (bad, good),
            FakeChatWorker(
                horde.url, owner, model_id=CHAT_MODEL, models=[CHAT_MODEL, TEXT_MODEL]
            ) as worker,
        ):
            assert (await worker.pop())["id"] is None  # online, declared
            answer = await admin.post(IPADDR, json={"ipaddr": "203.0.113.7", "hours": 1})
            assert (answer.status_code, answer.json()) == (200, {"message": "OK"})
            before = await stored_requests(horde)

            refused = await bad.text()
            assert_timed_out(refused, "for 3600 more seconds")
            assert refused.headers["Retry-After"] == "3600"
            assert_timed_out(await bad.chat())
            async with bad.openai() as sdk:
                with pytest.raises(openai.PermissionDeniedError) as chat_call:
                    await sdk.chat.completions.create(
                        model=CHAT_MODEL, messages=[{"role": "user", "content": "Hi"}]
                    )
                assert chat_call.value.status_code == 403
                assert "3600 more seconds" in str(chat_call.value)
                with pytest.raises(openai.PermissionDeniedError):
                    await sdk.completions.create(model=TEXT_MODEL, prompt="Once", max_tokens=8)
            assert await stored_requests(horde) == before  # nothing stored, nothing charged

            worker.client.headers["X-Forwarded-For"] = "203.0.113.7"
            popped = await refused_pop(worker)
            assert_timed_out(popped, "worker's IP address")

            # Another address is served as ever.
            assert (await good.text()).status_code == 202
            assert (await good.chat()).status_code == 202
            worker.client.headers["X-Forwarded-For"] = "203.0.113.8"
            assert (await worker.pop())["id"] is not None

            # The timeout lapses on the horde's clock, to the second.
            clock.advance(3599)
            assert_timed_out(await bad.text(), "for 1 more seconds")
            clock.advance(1)
            assert (await bad.text()).status_code == 202


async def test_a_blocked_range_and_an_ipv6_64_cover_their_members_until_lifted(
    database: str | None,
) -> None:
    async with open_horde(config=behind_proxy(), database=database) as horde:
        key = await horde.create_key("alice", kudos=1000)
        admin = await admin_of(horde)
        members = ("198.51.100.77", "198.51.100.1", "2001:db8:1:2::ffff", "2001:db8:1:2:3::9")
        others = ("198.51.101.1", "2001:db8:1:3::1")
        async with admin, clients(horde, key, *members, *others) as everyone:
            block = {"ipaddr": "198.51.100.0/24", "block": True}
            assert (await admin.post(IPADDR, json=block)).status_code == 200
            # One IPv6 address times out its /64.
            timeout = {"ipaddr": "2001:db8:1:2::7", "hours": 2}
            assert (await admin.post(IPADDR, json=timeout)).status_code == 200
            answers = [await c.text() for c in everyone]
            assert_timed_out(answers[0], "has been blocked")
            assert "Retry-After" not in answers[0].headers
            assert_timed_out(answers[1], "has been blocked")
            assert_timed_out(answers[2], "7200 more seconds")
            assert_timed_out(answers[3], "7200 more seconds")
            assert [a.status_code for a in answers[4:]] == [202, 202]

            listed = (await admin.get(IPADDR)).json()
            assert listed == [
                {"ipaddr": "198.51.100.0/24", "seconds": -1},
                {"ipaddr": "2001:db8:1:2::/64", "seconds": 7200},
            ]
            one = await admin.get(f"{IPADDR}/198.51.100.77")
            assert one.json() == [{"ipaddr": "198.51.100.0/24", "seconds": -1}]
            assert (await admin.get(f"{IPADDR}/198.51.100.0/24")).json() == one.json()
            assert (await admin.get(f"{IPADDR}/198.51.101.1")).json() == []

            # Lifted by any address of the /64, and the range by its name.
            lift = await admin.request("DELETE", IPADDR, json={"ipaddr": "2001:db8:1:2:ffff::1"})
            assert (lift.status_code, lift.json()) == (200, {"message": "OK"})
            await admin.request("DELETE", IPADDR, json={"ipaddr": "198.51.100.0/24"})
            assert (await admin.get(IPADDR)).json() == []
            assert [(await c.text()).status_code for c in everyone[:4]] == [202] * 4


async def test_only_admins_use_the_address_routes_and_bad_bodies_name_their_field() -> None:
    async with open_horde(config=behind_proxy()) as horde:
        user = await horde.create_key("alice")
        admin = await admin_of(horde)
        async with admin, httpx.AsyncClient(base_url=horde.url, verify=TLS) as http:
            worker_path = (
                "/api/v2/operations/block_worker_ipaddr/" + "0" * 8 + "-0000-0000-0000-" + "0" * 12
            )
            calls = [
                ("GET", IPADDR, None),
                ("POST", IPADDR, {"ipaddr": "203.0.113.7", "hours": 1}),
                ("DELETE", IPADDR, {"ipaddr": "203.0.113.7"}),
                ("GET", f"{IPADDR}/203.0.113.7", None),
                ("PUT", worker_path, {"days": 1}),
                ("DELETE", worker_path, None),
            ]
            for key in (user, ANON):
                for method, path, body in calls:
                    r = await http.request(method, path, json=body, headers={"apikey": key})
                    assert (r.status_code, r.json()["rc"]) == (403, "NotModerator"), (method, path)
            r = await http.get(IPADDR, headers={"apikey": "not-a-key-of-anyone"})
            assert (r.status_code, r.json()["rc"]) == (401, "InvalidAPIKey")
            bad = [
                ({"ipaddr": "nowhere", "hours": 1}, "ipaddr"),
                ({"ipaddr": "203.0.113.7", "hours": 0}, "hours"),
                ({"ipaddr": "203.0.113.7", "block": "yes"}, "block"),
            ]
            for body, field in bad:
                r = await admin.post(IPADDR, json=body)
                assert (r.status_code, r.json()["rc"]) == (400, "BadRequest")
                assert field in r.json()["errors"]
            r = await admin.put(worker_path, json={"days": 31})
            assert "days" in r.json()["errors"]
            assert (await admin.put(worker_path, json={"days": 1})).json()["rc"] == "WorkerNotFound"
            assert (await admin.get(IPADDR)).json() == []  # nothing stored


async def test_a_worker_s_address_is_kept_at_pop_and_its_block_refuses_it(
    database: str | None,
) -> None:
    async with open_horde(config=behind_proxy(), database=database) as horde:
        owner = await horde.create_key("bob")
        key = await horde.create_key("alice", kudos=100)
        admin = await admin_of(horde)
        async with (
            admin,
            FakeTextWorker(horde.url, owner, models=[TEXT_MODEL]) as worker,
            clients(horde, key, "2001:db8:9:9::1") as (same_64,),
        ):
            worker.client.headers["X-Forwarded-For"] = "2001:db8:9:9::abcd"
            assert (await worker.pop())["id"] is None
            worker_id = (await admin.get(f"/api/v2/workers/name/{worker.name}")).json()["id"]

            def address(conn: Any) -> str | None:
                found = conn.execute(select(workers.c.address).where(workers.c.id == worker_id))
                return found.scalar()  # type: ignore[no-any-return]

            assert await horde.horde.db.read(address) == "2001:db8:9:9::/64"
            path = f"/api/v2/operations/block_worker_ipaddr/{worker_id}"
            answer = await admin.put(path, json={"days": 2})
            assert (answer.status_code, answer.json()) == (200, {"message": "OK"})
            assert_timed_out(await refused_pop(worker), "worker's IP address")
            assert_timed_out(await same_64.text())  # the /64, whatever it runs
            assert (await admin.get(IPADDR)).json() == [
                {"ipaddr": "2001:db8:9:9::/64", "seconds": 2 * 86400}
            ]
            assert (await admin.delete(path)).json() == {"message": "OK"}
            assert (await worker.pop())["id"] is None

            entries = await horde.horde.store.read_audit(query=AuditQuery(target=worker_id))
            assert [e.action for e in entries] == ["worker.address_block"]
            assert entries[0].actor.startswith("root#")
            assert entries[0].address == "192.0.2.200"
            assert entries[0].detail == {"address": "2001:db8:9:9::/64", "seconds": 2 * 86400.0}
            lifted = await horde.horde.store.read_audit(query=AuditQuery(actions=("address.lift",)))
            assert lifted[0].detail == {"found": True, "worker_id": worker_id}


async def test_every_timeout_block_and_lift_is_audited_with_its_actor(database: str | None) -> None:
    async with open_horde(config=behind_proxy(), database=database) as horde:
        admin = await admin_of(horde, "192.0.2.33")
        async with admin:
            await admin.post(IPADDR, json={"ipaddr": "203.0.113.7", "hours": 3})
            await admin.post(IPADDR, json={"ipaddr": "198.51.100.0/24", "block": True})
            await admin.request("DELETE", IPADDR, json={"ipaddr": "203.0.113.7"})
        entries = await horde.horde.store.read_audit(
            query=AuditQuery(actions=("address.timeout", "address.block", "address.lift"))
        )
        assert [(e.action, e.target) for e in reversed(entries)] == [
            ("address.timeout", "203.0.113.7"),
            ("address.block", "198.51.100.0/24"),
            ("address.lift", "203.0.113.7"),
        ]
        assert {(e.actor_id is not None, e.address) for e in entries} == {(True, "192.0.2.33")}
        assert entries[-1].detail == {"seconds": 3 * 3600.0}


async def test_repeated_budget_refusals_grow_a_timeout(database: str | None) -> None:
    clock = ManualClock()
    config = behind_proxy(
        offence_timeout=60.0, budget_refusals_per_offence=2, offence_memory=3600.0
    ).replace(budgets={"anonymous_requests_held": 1, "anonymous_requests_per_minute": 1000})
    async with (
        open_horde(config=config, clock=clock, database=database) as horde,
        clients(horde, ANON, "203.0.113.50", "203.0.113.51") as (flooder, other),
    ):
        assert (await flooder.text()).status_code == 202  # holds its one request
        codes = [(await flooder.text()).status_code for _ in range(2)]
        assert codes == [429, 429]  # TooManyPrompts twice: the first offence
        assert_timed_out(await flooder.text(), "for 60 more seconds")
        assert (await other.text()).status_code == 202  # its own budget, no offence
        clock.advance(60)
        codes = [(await flooder.text()).status_code for _ in range(2)]
        assert codes == [429, 429]  # the second offence: three times as long
        assert_timed_out(await flooder.text(), "for 180 more seconds")

        entries = await horde.horde.store.read_audit(query=AuditQuery(actions=("address.timeout",)))
        assert [(e.actor, e.target, e.detail["offences"]) for e in reversed(entries)] == [
            ("horde", "203.0.113.50", 1),
            ("horde", "203.0.113.50", 2),
        ]
        assert entries[0].detail == {"seconds": 180.0, "offences": 2, "kind": "budget"}


async def test_a_filter_refusal_times_the_address_out_at_once(database: str | None) -> None:
    # A prompt a filter refuses (400 CorruptPrompt) is its address's
    # offence: the next request from there, however clean, is timed out;
    # another address is not. A chat message refused counts the same.
    async with open_horde(config=behind_proxy(), database=database) as horde:
        key = await horde.create_key("alice", kudos=100)
        admin = await admin_of(horde)
        async with admin, clients(horde, key, "203.0.113.60", "203.0.113.61") as (bad, good):
            made = await admin.put("/api/v2/filters", json={"regex": "hel+o", "filter_type": 10})
            assert made.status_code == 201, made.text
            refused = await bad.text()  # text_body's prompt is "Hello"
            assert (refused.status_code, refused.json()["rc"]) == (400, "CorruptPrompt")
            clean = {**text_body(), "prompt": "Good day"}
            assert_timed_out(await bad.http.post(TEXT_ASYNC, json=clean), "for 180 more seconds")
            assert (await good.http.post(TEXT_ASYNC, json=clean)).status_code == 202
            chat = await good.http.post(
                CHAT_ASYNC, json={**chat_body(), "messages": [{"role": "user", "content": "hello"}]}
            )
            assert (chat.status_code, chat.json()["rc"]) == (400, "CorruptPrompt")
            assert_timed_out(await good.http.post(TEXT_ASYNC, json=clean))


async def test_a_check_reads_no_rules_while_their_version_stands() -> None:
    async with open_horde(config=behind_proxy()) as horde:
        key = await horde.create_key("alice", kudos=1000)
        admin = await admin_of(horde)
        async with admin, clients(horde, key, "203.0.113.7") as (bad,):
            await admin.post(IPADDR, json={"ipaddr": "203.0.113.7", "hours": 1})
            assert_timed_out(await bad.text())  # read once after the change
            # Refused submits for long enough that the process looks again.
            start = anyio.current_time()
            with statements(horde) as sent:
                while anyio.current_time() - start < 1.5 * ADDRESS_RULES_SECONDS:
                    assert_timed_out(await bad.text())
            elapsed = anyio.current_time() - start
            # No read of the rules themselves: the version stands. The
            # version is read at most once per ADDRESS_RULES_SECONDS.
            assert [s for s in sent if re.search(r"FROM address_rules\b(?!_)", s)] == []
            version_reads = [s for s in sent if "address_rules_version" in s]
            assert 1 <= len(version_reads) <= 1 + elapsed / ADDRESS_RULES_SECONDS
            # A refusal stores nothing.
            assert not [s for s in sent if s.lstrip().upper().startswith(("INSERT", "UPDATE"))]


@pytest.mark.postgres
async def test_a_timeout_set_on_one_replica_is_enforced_by_another_within_seconds(
    postgres_schema_url: str,
) -> None:
    # Two hordes on one PostgreSQL database and no Redis: the version poll
    # is all that carries the change. A worker's pops to B poll it: they
    # queue nothing, so no budget of the address's fills meanwhile.
    config = behind_proxy()
    async with (
        open_horde(config=config, database=postgres_schema_url) as a,
        open_horde(config=config, database=postgres_schema_url) as b,
    ):
        owner = await a.create_key("bob")
        admin = await admin_of(a)
        async with admin, FakeTextWorker(b.url, owner, models=[TEXT_MODEL]) as worker:
            worker.client.headers["X-Forwarded-For"] = "203.0.113.7"

            async def pop_status() -> int:
                response = await worker.client.post("/generate/text/pop", json=worker.pop_body())
                return response.status_code

            assert await pop_status() == 200  # B has looked: nothing in force
            set_on_a = await admin.post(IPADDR, json={"ipaddr": "203.0.113.7", "hours": 1})
            assert set_on_a.status_code == 200, set_on_a.text

            async def refused() -> bool:
                return await pop_status() == 403

            await eventually(refused, within=REPLICA_DEADLINE)
            lifted = await admin.request("DELETE", IPADDR, json={"ipaddr": "203.0.113.7"})
            assert lifted.status_code == 200, lifted.text

            async def served() -> bool:
                return await pop_status() == 200

            await eventually(served, within=REPLICA_DEADLINE)
