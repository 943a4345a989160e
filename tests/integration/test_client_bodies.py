"""The calls of real AI Horde clients and workers, replayed from fixtures
(tests/fixtures/clients/*.json): KoboldAI Lite, SillyTavern, the AI Horde's
own worker bridge (its pop, submit and faulted submit) and koboldcpp's
embedded worker. Each fixture is the routes a client calls, in its order,
with the headers and bodies it sends; every step must get the status the
AI Horde gives it.

A step may name its key (``requester``: a user with kudos; ``owner``: the
owner of the worker ``{worker_id}``, registered before the steps), save
fields of its answer for later steps (``{request_id}``, ``{job_id}``) and
check fields of its answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from hordelite.testing import FakeTextWorker, open_horde

pytestmark = pytest.mark.anyio

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "clients").glob("*.json"))
REPLAYS = {f.stem: json.loads(f.read_text()) for f in FIXTURES}
MODEL = "koboldcpp/test-model"


def fill(value: Any, saved: dict[str, str]) -> Any:
    """``value`` with every ``{name}`` of a saved field replaced."""
    if isinstance(value, str):
        for name, found in saved.items():
            value = value.replace("{" + name + "}", found)
        return value
    if isinstance(value, list):
        return [fill(v, saved) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, saved) for k, v in value.items()}
    return value


@pytest.mark.parametrize("name", sorted(REPLAYS))
async def test_a_clients_calls_get_the_ai_hordes_answers(name: str) -> None:
    replay = REPLAYS[name]
    async with open_horde() as horde, httpx.AsyncClient(base_url=horde.url, timeout=30) as client:
        keys = {
            "requester": await horde.create_key("requester", kudos=1000),
            "owner": await horde.create_key("owner"),
        }
        async with FakeTextWorker(
            horde.url, keys["owner"], name="fixture-worker", models=[MODEL]
        ) as w:
            await w.pop()
        saved = {
            "worker_id": (await client.get("/api/v2/workers/name/fixture-worker")).json()["id"]
        }
        for i, step in enumerate(replay["steps"]):
            headers = dict(replay["headers"])
            if "key" in step:
                headers["apikey"] = keys[step["key"]]
            r = await client.request(
                step["method"],
                fill(step["path"], saved),
                headers=headers,
                json=fill(step["body"], saved) if "body" in step else None,
            )
            where = f"{name} step {i}: {step['method']} {step['path']}"
            assert r.status_code == step["expect"], f"{where}: {r.text}"
            assert r.headers["content-type"].startswith("application/json"), where
            answer = r.json()
            for field, value in step.get("check", {}).items():
                assert answer[field] == value, f"{where}: {field} is {answer[field]!r}"
            for name, field in step.get("save", {}).items():
                assert answer[field], f"{where}: no {field} to save"
                saved[name] = str(answer[field])
