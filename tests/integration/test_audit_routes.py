"""The audit trail through the routes, on a running horde (SQLite and
PostgreSQL):

* an admin's PUT /users/{id} and PUT /workers/{id} are recorded as the
  admin's ``name#id`` from the client's address (a trusted proxy's
  X-Forwarded-For); a worker's owner's own maintenance is not;
* GET /api/v2/operations/audit answers admins a JSON list newest first,
  filtered, paged by ``before`` (X-Next-Before and a Link to the next
  page); anyone else gets 403 NotModerator, a bad parameter 400 naming it;
  reading is not recorded;
* the sweep deletes entries older than [moderation] audit_retention.
"""

from __future__ import annotations

import httpx
import pytest

from hordelite.clock import ManualClock
from hordelite.config import Config
from hordelite.testing import FakeTextWorker, open_horde
from tests.integration._helpers import assert_refused

pytestmark = pytest.mark.anyio

AUDIT = "/api/v2/operations/audit"
CLIENT = "198.51.100.23"
# The test's client is the proxy: the horde believes its X-Forwarded-For.
PROXIED = Config().replace(server={"trusted_proxies": "127.0.0.1"})


async def _id(client: httpx.AsyncClient, key: str) -> int:
    return int((await client.get("/api/v2/find_user", headers={"apikey": key})).json()["id"])


async def test_an_admins_edits_through_the_routes_are_read_back_with_the_forwarded_address(
    database: str | None,
) -> None:
    async with open_horde(config=PROXIED, database=database) as horde:
        admin = await horde.create_key("mod", admin=True)
        owner = await horde.create_key("owner", kudos=3)
        as_admin = {"apikey": admin, "X-Forwarded-For": CLIENT}
        async with (
            httpx.AsyncClient(base_url=horde.url) as client,
            FakeTextWorker(horde.url, owner, models=["m1"]) as worker,
        ):
            await worker.pop()
            worker_id = (await client.get("/api/v2/workers")).json()[0]["id"]
            owner_id = await _id(client, owner)
            admin_id = await _id(client, admin)
            edited = await client.put(
                f"/api/v2/users/{owner_id}", headers=as_admin, json={"kudos": 7, "trusted": True}
            )
            assert edited.status_code == 200, edited.text
            paused = await client.put(
                f"/api/v2/workers/{worker_id}", headers=as_admin, json={"paused": True}
            )
            assert paused.status_code == 200, paused.text
            own = await client.put(
                f"/api/v2/workers/{worker_id}",
                headers={"apikey": owner, "X-Forwarded-For": CLIENT},
                json={"maintenance": True},
            )
            assert own.status_code == 200, own.text

            read = await client.get(AUDIT, headers={"apikey": admin})
            assert read.status_code == 200, read.text
            trail = read.json()
            assert [e["action"] for e in trail] == ["worker.pause", "user.edit", "kudos.grant"]
            for entry in trail:
                assert (entry["actor"], entry["actor_id"]) == (f"mod#{admin_id}", admin_id)
                assert entry["address"] == CLIENT
            assert trail[0]["target"] == worker_id
            assert trail[1]["detail"] == {"trusted": [False, True]}
            assert trail[2]["target"] == f"owner#{owner_id}"
            assert trail[2]["detail"] == {"amount": 7.0, "before": 3.0, "after": 10.0}
            assert "x-next-before" not in read.headers
            # Reading the trail is not itself recorded.
            again = await client.get(AUDIT, headers={"apikey": admin})
            assert again.json() == trail


async def test_the_admin_route_filters_and_pages_newest_first(database: str | None) -> None:
    async with open_horde(database=database) as horde:
        admin = await horde.create_key("mod", admin=True)
        users = [await horde.create_key(f"u{i}") for i in range(5)]
        async with httpx.AsyncClient(base_url=horde.url) as client:
            for key in users:
                user_id = await _id(client, key)
                r = await client.put(
                    f"/api/v2/users/{user_id}", headers={"apikey": admin}, json={"kudos": 1}
                )
                assert r.status_code == 200, r.text
            r = await client.put(
                f"/api/v2/users/{await _id(client, users[0])}",
                headers={"apikey": admin},
                json={"concurrency": 2},
            )
            assert r.status_code == 200, r.text

            seen: list[str] = []
            url: str | None = f"{AUDIT}?action=kudos.grant&limit=2"
            pages = 0
            while url is not None:
                page = await client.get(url, headers={"apikey": admin})
                assert page.status_code == 200, page.text
                pages += 1
                seen += [e["target"] for e in page.json()]
                link = page.links.get("next")
                if link is not None:
                    assert f"before={page.headers['x-next-before']}" in link["url"]
                url = link["url"] if link is not None else None
            assert pages == 3
            assert [t.split("#")[0] for t in seen] == ["u4", "u3", "u2", "u1", "u0"]

            one = await client.get(
                AUDIT,
                headers={"apikey": admin},
                params={"action": "user.edit,kudos.grant", "target": seen[-1], "since": "1h"},
            )
            assert [e["action"] for e in one.json()] == ["user.edit", "kudos.grant"]
            by_cli = await client.get(AUDIT, headers={"apikey": admin}, params={"actor": "cli"})
            assert by_cli.json() == []


async def test_anyone_but_an_admin_is_refused_and_a_bad_parameter_is_named() -> None:
    async with open_horde() as horde:
        admin = await horde.create_key("mod", admin=True)
        user = await horde.create_key("someone", trusted=True)
        async with httpx.AsyncClient(base_url=horde.url) as client:
            assert_refused(await client.get(AUDIT, headers={"apikey": user}), 403, "NotModerator")
            assert_refused(
                await client.get(AUDIT, headers={"apikey": "0000000000"}), 403, "NotModerator"
            )
            assert_refused(await client.get(AUDIT), 401, "InvalidAPIKey", "apikey")
            for param, value in (
                ("action", "kudos.granted"),
                ("since", "soon"),
                ("limit", "0"),
                ("limit", "501"),
                ("before", "x"),
            ):
                body = assert_refused(
                    await client.get(AUDIT, headers={"apikey": admin}, params={param: value}),
                    400,
                    "BadRequest",
                    param,
                    case=param,
                )
                assert param in body["errors"]


async def test_the_sweep_deletes_entries_older_than_the_retention(database: str | None) -> None:
    clock = ManualClock(1_000_000.0)
    config = Config().replace(moderation={"audit_retention": 3600})
    async with open_horde(config=config, clock=clock, database=database) as horde:
        admin = await horde.create_key("mod", admin=True)
        target = await horde.create_key("alice")
        async with httpx.AsyncClient(base_url=horde.url) as client:
            alice = await _id(client, target)

            async def grant(amount: int) -> None:
                r = await client.put(
                    f"/api/v2/users/{alice}", headers={"apikey": admin}, json={"kudos": amount}
                )
                assert r.status_code == 200, r.text

            async def amounts() -> list[float]:
                trail = (await client.get(AUDIT, headers={"apikey": admin})).json()
                return [e["detail"]["amount"] for e in trail]

            await grant(1)
            clock.advance(1800)
            await grant(2)
            clock.advance(1801)  # the first is 3601 s old, the second 1801 s
            await horde.sweep()
            assert await amounts() == [2.0]
            clock.advance(1800)
            await horde.sweep()
            assert await amounts() == []
