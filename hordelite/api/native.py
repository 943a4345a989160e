"""The native AI Horde v2 routes: parse, call the service, answer.

Every answer is JSON with ``Access-Control-Allow-Origin`` (``*`` unless
``server.cors_origins`` lists origins, see hordelite/app.py); every refusal
is ``{"message", "rc"}`` (plus ``errors`` naming the field for validation
failures) with the return code's HTTP status.
"""

from __future__ import annotations

import json
from typing import Any, cast
from urllib.parse import urlencode

from quart import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from hordelite._request import client_address, client_agent, horde, json_body, public_base_url
from hordelite.api import _render
from hordelite.contract.headers import checked_api_key, checked_operation_key
from hordelite.contract.limits import (
    MODELS_PAGE,
    USERS_PAGE,
    WORKERS_PAGE,
)
from hordelite.contract.text import parse_count_bound, parse_page, parse_status_wait
from hordelite.errors import RC, HordeError
from hordelite.horde.results import Queued
from hordelite.http.server import ARRIVED

native = Blueprint("native", __name__, url_prefix="/api/v2")


def json_response(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")


def http_error_response(exc: HTTPException) -> Response:
    """An HTTP error without a return code of its own: its name is the rc."""
    message = exc.description or exc.name
    return json_response({"message": message, "rc": exc.name.replace(" ", "")}, exc.code or 500)


def api_key() -> str:
    return checked_api_key(request.headers.get("apikey"))


def operation_key() -> str | None:
    """The Idempotency-Key header: a resubmit with the same key returns the
    first request (a transfer: the first transfer's answer)."""
    return checked_operation_key(request.headers.get("Idempotency-Key"))


@native.post("/generate/text/async")
async def text_async() -> Response:
    body = await json_body()
    answer = await horde().requests.submit_text(
        api_key(), body, client_agent(), operation_key(), client=client_address()
    )
    # A dry run queues nothing: 200 with its quote.
    return json_response(_render.queued(answer), 202 if isinstance(answer, Queued) else 200)


@native.post("/generate/chat/async")
async def chat_async() -> Response:
    body = await json_body()
    answer = await horde().requests.submit_chat(
        api_key(), body, client_agent(), operation_key(), client=client_address()
    )
    return json_response(_render.queued(answer), 202)


@native.get("/generate/chat/status/<request_id>")
async def chat_status(request_id: str) -> Response:
    wait = parse_status_wait(request.args.get("wait"))
    return json_response(
        _render.status(await horde().requests.status("chat", request_id, wait=wait))
    )


@native.delete("/generate/chat/status/<request_id>")
async def chat_cancel(request_id: str) -> Response:
    return json_response(_render.status(await horde().requests.cancel("chat", request_id)))


@native.get("/generate/text/status/<request_id>")
async def text_status(request_id: str) -> Response:
    wait = parse_status_wait(request.args.get("wait"))
    return json_response(
        _render.status(await horde().requests.status("text", request_id, wait=wait))
    )


@native.get("/generate/text/request/<request_id>")
async def text_request(request_id: str) -> Response:
    # The request as queued: its prompt is the requester's, so the key is.
    found = await horde().requests.submitted_text(api_key(), request_id)
    return json_response(_render.submitted_text(found))


@native.delete("/generate/text/status/<request_id>")
async def text_cancel(request_id: str) -> Response:
    return json_response(_render.status(await horde().requests.cancel("text", request_id)))


@native.post("/generate/text/pop")
async def text_pop() -> Response:
    body = await json_body()
    arrived = cast(float | None, request.scope.get(ARRIVED))
    # The signed image and messages URLs start with it.
    base_url = public_base_url()
    answer = await horde().jobs.pop(api_key(), body, arrived=arrived, base_url=base_url)
    return json_response(_render.pop(answer))


@native.post("/generate/text/progress")
async def text_progress() -> Response:
    body = await json_body()
    return json_response(_render.progress(await horde().jobs.post_progress(api_key(), body)))


@native.post("/generate/text/submit")
async def text_submit() -> Response:
    body = await json_body()
    return json_response(_render.submitted(await horde().jobs.submit(api_key(), body)))


@native.get("/status/heartbeat")
async def heartbeat() -> Response:
    return json_response(horde().upkeep.heartbeat())


@native.get("/status/models")
async def status_models() -> Response:
    with_chat = request.args.get("chat", "false").lower() in ("true", "1", "yes")
    page = parse_page(request.args.get("page"))
    least = parse_count_bound("min_count", request.args.get("min_count"))
    most = parse_count_bound("max_count", request.args.get("max_count"))
    # The type defaults to image, as on the AI Horde: a text-only horde
    # serves no image model, so a client asking for those gets none.
    if request.args.get("type", "image") != "text":
        return json_response([])
    found = await horde().directory.model_page(page, with_chat)
    body = [
        _render.model(m)
        for m in found.models
        if (least is None or m.count >= least) and (most is None or m.count <= most)
    ]
    return paged(body, page, MODELS_PAGE, found.total)


@native.get("/status/models/<path:name>")
async def status_model(name: str) -> Response:
    # A list, as on the AI Horde: the model's entry, or none when no online
    # worker serves it.
    found = await horde().directory.model(name)
    return json_response([] if found is None else [_render.model(found)])


@native.get("/workers")
async def workers() -> Response:
    # An empty type means every type (horde_sdk's default listing sends ``type=``).
    page = parse_page(request.args.get("page"))
    if request.args.get("type", "text") not in ("text", ""):
        return json_response([])
    name = request.args.get("name")
    if name:
        # The worker of this exact name, case-insensitively (horde_sdk's
        # worker_name), online or not: a list of it, or none.
        found_one = await horde().directory.named_worker(name)
        return json_response([] if found_one is None else [_render.worker(found_one)])
    found = await horde().directory.worker_page(page)
    body = [_render.worker(w) for w in found.workers]
    return paged(body, page, WORKERS_PAGE, found.total)


def paged(body: list[dict[str, Any]], page: int, size: int, total: int) -> Response:
    """A page of a listing, still the AI Horde's JSON list, with how many
    entries there are in all (``X-Total-Count``) and, when more follow, the
    next page's URL (``Link: <...>; rel="next"``, the request's own query
    with the next page number). In UTF-8 rather than ``\\u`` escapes: a
    name's character then takes at most 6 bytes (a control character), not
    12 (a character outside the BMP), which halves the page's bound."""
    response = Response(
        json.dumps(body, ensure_ascii=False), status=200, content_type="application/json"
    )
    response.headers["X-Total-Count"] = str(total)
    if page * size < total:
        query = [(k, v) for k, v in request.args.items(multi=True) if k != "page"]
        query.append(("page", str(page + 1)))
        response.headers["Link"] = f'<{request.path}?{urlencode(query)}>; rel="next"'
    return response


@native.get("/workers/messages")
async def worker_messages() -> Response:
    page = parse_page(request.args.get("page"))
    found = await horde().messages.listing(
        api_key(), request.args.get("worker_id"), request.args.get("validity"), page
    )
    return json_response([_render.worker_message(m) for m in found])


@native.post("/workers/messages")
async def worker_message_send() -> Response:
    body = await json_body()
    return json_response(_render.worker_message(await horde().messages.send(api_key(), body)))


@native.get("/workers/messages/<message_id>")
async def worker_message(message_id: str) -> Response:
    found = await horde().messages.one(message_id)
    if found is None:
        raise HordeError(RC.MessageNotFound, f"No message with id {message_id[:64]!r}.")
    return json_response(_render.worker_message(found))


@native.delete("/workers/messages/<message_id>")
async def worker_message_delete(message_id: str) -> Response:
    if not await horde().messages.delete(api_key(), message_id):
        raise HordeError(RC.MessageNotFound, f"No message with id {message_id[:64]!r}.")
    return json_response({"message": "OK"})


@native.get("/workers/<worker_id>")
async def worker(worker_id: str) -> Response:
    return json_response(_render.worker(await horde().directory.worker(worker_id)))


@native.put("/workers/<worker_id>")
async def worker_update(worker_id: str) -> Response:
    body = await json_body()
    return json_response(
        _render.worker_update(await horde().directory.update_worker(api_key(), worker_id, body))
    )


@native.delete("/workers/<worker_id>")
async def worker_delete(worker_id: str) -> Response:
    return json_response(
        _render.deleted_worker(await horde().directory.delete_worker(api_key(), worker_id))
    )


@native.get("/workers/name/<path:name>")
async def worker_by_name(name: str) -> Response:
    return json_response(_render.worker(await horde().directory.worker_by_name(name)))


@native.get("/find_user")
async def find_user() -> Response:
    found = await horde().directory.find_user(api_key())
    # Found by a shared key: anyone's view of its lender (the AI Horde's).
    return json_response(_render.user(found, private=found.via_shared_key is None))


@native.get("/users/<user_id>")
async def user(user_id: str) -> Response:
    directory = horde().directory
    found, private = await directory.user_as_seen(user_id, request.headers.get("apikey"))
    return json_response(_render.user(found, private=private))


@native.put("/users/<user_id>")
async def modify_user(user_id: str) -> Response:
    body = await json_body(optional=True)
    changed = await horde().directory.modify_user(api_key(), user_id, body)
    return json_response(_render.user_modified(changed))


@native.get("/users")
async def users() -> Response:
    # Anyone's view of every user, a page at a time (KoboldAI Lite's ranking).
    page = parse_page(request.args.get("page"))
    found = await horde().directory.user_page(page, request.args.get("sort"))
    body = [_render.user(u, private=False) for u in found.users]
    return paged(body, page, USERS_PAGE, found.total)


@native.post("/kudos/transfer")
async def kudos_transfer() -> Response:
    body = await json_body()
    moved = await horde().directory.transfer_kudos(api_key(), body, operation_key())
    return json_response({"transferred": moved})
