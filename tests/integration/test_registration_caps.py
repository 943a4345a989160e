"""What one key may register, through the real app: the workers a user may
have (budgets.workers_per_user, trusted_workers_per_user) and the models one
pop may declare (budgets.models_per_worker). Every pop is horde_sdk's own
body (``TextGenerateJobPopRequest``), sent the way the SDK sends it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from horde_sdk import RequestErrorResponse
from horde_sdk.ai_horde_api.apimodels import (
    AllWorkersDetailsRequest,
    AllWorkersDetailsResponse,
    SingleWorkerDetailsResponse,
    SingleWorkerNameDetailsRequest,
    TextGenerateJobPopResponse,
)

from hordelite.config import Config
from hordelite.testing import TestHorde, open_horde
from tests.integration._env import open_env
from tests.integration.test_horde_sdk import pop_request, send, success

pytestmark = pytest.mark.anyio


def budgets(**keys: Any) -> Config:
    """The default configuration with these [budgets] keys (and the signals
    open_horde would use: the Redis suite runs these too)."""
    return Config().replace(
        signals={"url": os.environ.get("HORDELITE_SIGNALS_URL", "")}, budgets=keys
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of each kind: a SQLite file, or a PostgreSQL schema of its
    own (skipped without HORDELITE_TEST_POSTGRES_URL)."""
    if request.param == "sqlite":
        yield str(tmp_path / "horde.db")
    else:
        yield request.getfixturevalue("postgres_schema_url")


async def pop(
    client: httpx.AsyncClient,
    horde: TestHorde,
    key: str,
    name: str,
    models: list[str] | None = None,
) -> httpx.Response:
    """One pop of horde_sdk's body (no job is queued: an empty answer)."""
    fields: dict[str, Any] = {"name": name}
    if models is not None:
        fields["models"] = models
    return await send(client, horde, pop_request(key, **fields))


async def registers(client: httpx.AsyncClient, horde: TestHorde, key: str, name: str) -> None:
    request = pop_request(key, name=name)
    answer = success(await send(client, horde, request), request, TextGenerateJobPopResponse)
    assert answer.id_ is None


def refused(response: httpx.Response, status: int, rc: str) -> str:
    """The refusal's message; the body is one the SDK's error model reads."""
    assert response.status_code == status, response.text
    error = RequestErrorResponse.model_validate(response.json())
    assert error.rc == rc
    return error.message


async def listed(client: httpx.AsyncClient, horde: TestHorde) -> list[str]:
    listing = AllWorkersDetailsRequest()
    answer = success(await send(client, horde, listing), listing, AllWorkersDetailsResponse)
    return sorted(w.name or "" for w in answer)


async def worker_models(client: httpx.AsyncClient, horde: TestHorde, name: str) -> list[str]:
    request = SingleWorkerNameDetailsRequest(worker_name=name)
    answer = success(await send(client, horde, request), request, SingleWorkerDetailsResponse)
    return list(answer.models or [])


def names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i:02d}" for i in range(count)]


# Workers per user ---------------------------------------------------------------


async def test_the_21st_worker_of_a_user_is_refused_with_403_TooManyWorkers_and_not_registered() -> (
    None
):
    async with (
        open_env(requester_kudos=0) as env,
        httpx.AsyncClient() as client,
    ):
        for name in names("w", 20):
            await registers(client, env.horde, env.requester, name)
        message = refused(await pop(client, env.horde, env.requester, "w20"), 403, "TooManyWorkers")
        assert "has 20 workers registered and may have at most 20" in message
        assert "(budgets.workers_per_user)" in message
        assert "'w20'" in message
        assert await listed(client, env.horde) == names("w", 20)
        missing = await send(client, env.horde, SingleWorkerNameDetailsRequest(worker_name="w20"))
        assert missing.status_code == 404, missing.text


async def test_a_registered_worker_pops_again_after_the_cap_is_reached_and_after_it_is_lowered(
    tmp_path: Path,
) -> None:
    database = str(tmp_path / "horde.db")
    async with (
        open_horde(config=budgets(workers_per_user=2), database=database) as horde,
        httpx.AsyncClient() as client,
    ):
        alice = await horde.create_key("alice")
        await registers(client, horde, alice, "w1")
        await registers(client, horde, alice, "w2")
        refused(await pop(client, horde, alice, "w3"), 403, "TooManyWorkers")
        await registers(client, horde, alice, "w1")
        await registers(client, horde, alice, "W2")  # the same worker, by its name's key
    # The operator lowers the cap below what alice has: her workers still pop.
    async with (
        open_horde(config=budgets(workers_per_user=1), database=database) as horde,
        httpx.AsyncClient() as client,
    ):
        await registers(client, horde, alice, "w1")
        await registers(client, horde, alice, "w2")
        message = refused(await pop(client, horde, alice, "w3"), 403, "TooManyWorkers")
        assert "has 2 workers registered and may have at most 1" in message


async def test_a_trusted_user_gets_its_own_cap() -> None:
    config = budgets(workers_per_user=1, trusted_workers_per_user=3)
    async with open_horde(config=config) as horde, httpx.AsyncClient() as client:
        plain = await horde.create_key("plain")
        trusted = await horde.create_key("trusted", trusted=True)
        await registers(client, horde, plain, "p0")
        message = refused(await pop(client, horde, plain, "p1"), 403, "TooManyWorkers")
        assert "may have at most 1 (budgets.workers_per_user)" in message
        for name in names("t", 3):
            await registers(client, horde, trusted, name)
        message = refused(await pop(client, horde, trusted, "t03"), 403, "TooManyWorkers")
        assert "may have at most 3 (budgets.trusted_workers_per_user)" in message
        assert await listed(client, horde) == ["p0", *names("t", 3)]


async def test_an_admin_is_exempt_from_the_workers_cap() -> None:
    config = budgets(workers_per_user=1, trusted_workers_per_user=1)
    async with open_horde(config=config) as horde, httpx.AsyncClient() as client:
        admin = await horde.create_key("admin", admin=True)
        for name in names("a", 5):
            await registers(client, horde, admin, name)
        assert await listed(client, horde) == names("a", 5)


async def test_zero_lifts_the_workers_cap() -> None:
    async with (
        open_env(config=budgets(workers_per_user=0), requester_kudos=0) as env,
        httpx.AsyncClient() as client,
    ):
        for name in names("w", 25):  # past the default of 20
            await registers(client, env.horde, env.requester, name)
        assert len(await listed(client, env.horde)) == 25


async def test_ten_first_pops_at_once_register_exactly_the_cap(database: str) -> None:
    async with (
        open_env(config=budgets(workers_per_user=3), database=database, requester_kudos=0) as env,
        httpx.AsyncClient() as client,
    ):
        statuses: list[int] = []

        async def one(name: str) -> None:
            statuses.append((await pop(client, env.horde, env.requester, name)).status_code)

        async with anyio.create_task_group() as tg:
            for name in names("w", 10):
                tg.start_soon(one, name)
        assert sorted(statuses) == [200] * 3 + [403] * 7
        assert len(await listed(client, env.horde)) == 3


# Models per worker ------------------------------------------------------------------


async def test_a_pop_declaring_11_models_is_refused_with_400_TooManyModels_and_not_registered() -> (
    None
):
    async with (
        open_env(requester_kudos=0) as env,
        httpx.AsyncClient() as client,
    ):
        response = await pop(client, env.horde, env.requester, "many", names("model-", 11))
        message = refused(response, 400, "TooManyModels")
        assert message == (
            "models: declares 11 models; a worker may declare at most 10 "
            "(budgets.models_per_worker)."
        )
        assert response.json()["errors"] == {
            "models": "declares 11 models; a worker may declare at most 10"
        }
        assert await listed(client, env.horde) == []
        # Ten are fine, and a name sent twice is one model.
        await pop(client, env.horde, env.requester, "ten", [*names("model-", 10), "model-00"])
        assert await worker_models(client, env.horde, "ten") == names("model-", 10)


async def test_a_registered_worker_declaring_too_many_models_is_refused_and_left_as_it_was() -> (
    None
):
    async with (
        open_env(requester_kudos=0) as env,
        httpx.AsyncClient() as client,
    ):
        assert (await pop(client, env.horde, env.requester, "w", ["a", "b"])).status_code == 200
        response = await pop(client, env.horde, env.requester, "w", names("model-", 11))
        refused(response, 400, "TooManyModels")
        assert await worker_models(client, env.horde, "w") == ["a", "b"]


async def test_zero_lifts_the_models_cap() -> None:
    async with (
        open_env(config=budgets(models_per_worker=0), requester_kudos=0) as env,
        httpx.AsyncClient() as client,
    ):
        response = await pop(client, env.horde, env.requester, "many", names("model-", 50))
        assert response.status_code == 200, response.text
        assert await worker_models(client, env.horde, "many") == names("model-", 50)
