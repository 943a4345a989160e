"""The native routes of shared keys (``/sharedkeys``, decision 0058): create
(PUT, as the AI Horde), read, change (PATCH) and delete one. Every answer
is the AI Horde's JSON."""

from __future__ import annotations

from quart import Blueprint, Response

from hordelite._request import horde, json_body
from hordelite.api import _render
from hordelite.api.native import api_key, json_response

sharedkeys = Blueprint("sharedkeys", __name__, url_prefix="/api/v2")


@sharedkeys.put("/sharedkeys")
async def create() -> Response:
    body = await json_body(optional=True)
    made = await horde().shared_keys.create(api_key(), body)
    return json_response(_render.shared_key(made))


@sharedkeys.get("/sharedkeys/<key_id>")
async def details(key_id: str) -> Response:
    return json_response(_render.shared_key(await horde().shared_keys.details(key_id)))


@sharedkeys.patch("/sharedkeys/<key_id>")
async def edit(key_id: str) -> Response:
    body = await json_body()
    changed = await horde().shared_keys.edit(api_key(), key_id, body)
    return json_response(_render.shared_key(changed))


@sharedkeys.delete("/sharedkeys/<key_id>")
async def delete(key_id: str) -> Response:
    await horde().shared_keys.delete(api_key(), key_id)
    return json_response({"message": "OK"})
