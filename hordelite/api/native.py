"""The native AI Horde v2 routes: parse, call the service, answer.

Each route is a method from a ``Request`` to an ``Answer``, listed once in
the route table (hordelite/http/routes.py). Every answer is JSON; every
refusal is the AI Horde's ``{"message", "rc"}`` (plus ``errors`` naming the
field of a validation failure) with the return code's HTTP status
(hordelite/http/envelopes.py).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlencode

from hordelite.api import _render
from hordelite.contract.limits import MODELS_PAGE, USERS_PAGE, WORKERS_PAGE
from hordelite.contract.text import parse_count_bound, parse_page, parse_status_wait
from hordelite.errors import RC, HordeError
from hordelite.horde.requests import Submitter
from hordelite.horde.results import Queued
from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request

P = ParamSpec("P")
T = TypeVar("T")


class NativeRoutes:
    """The generation, worker, user and kudos routes under /api/v2."""

    def __init__(self, horde: Horde) -> None:
        self.horde = horde

    # Generation ----------------------------------------------------------------

    async def text_async(self, request: Request) -> Answer:
        return await self._submit("text", request)

    async def chat_async(self, request: Request) -> Answer:
        return await self._submit("chat", request)

    async def _submit(self, kind: str, request: Request) -> Answer:
        requests = self.horde.requests
        submit = requests.submit_text if kind == "text" else requests.submit_chat
        body = await request.json()
        submitter = Submitter(
            request.api_key(),
            request.client_agent(),
            request.operation_key(),
            client=request.client_address(),
        )
        answer = await submit(submitter, body)
        # A dry run (text only) queues nothing: 200 with its quote.
        return json_answer(_render.queued(answer), 202 if isinstance(answer, Queued) else 200)

    async def text_status(self, request: Request) -> Answer:
        return await self._status("text", request)

    async def chat_status(self, request: Request) -> Answer:
        return await self._status("chat", request)

    async def _status(self, kind: str, request: Request) -> Answer:
        request_id = request.params["request_id"]
        wait = parse_status_wait(request.arg("wait"))
        status = self.horde.requests.status
        if wait:  # a long poll: the client may leave meanwhile
            found = await request.unless_gone(lambda: status(kind, request_id, wait=wait))
        else:
            found = await status(kind, request_id, wait=wait)
        return json_answer(_render.status(found))

    async def text_cancel(self, request: Request) -> Answer:
        return await self._cancel("text", request)

    async def chat_cancel(self, request: Request) -> Answer:
        return await self._cancel("chat", request)

    async def _cancel(self, kind: str, request: Request) -> Answer:
        found = await self.horde.requests.cancel(kind, request.params["request_id"])
        return json_answer(_render.status(found))

    async def text_request(self, request: Request) -> Answer:
        # The request as queued: its prompt is the requester's, so the key is.
        submitted_text = self.horde.requests.submitted_text
        return await keyed(request, "request_id", submitted_text, _render.submitted_text)

    async def text_pop(self, request: Request) -> Answer:
        body = await request.json()
        key = request.api_key()
        # The signed image and messages URLs start with it.
        base_url = request.public_base_url()
        arrived = request.arrived
        client = request.client_address()  # refused when timed out, kept on the worker
        pop = functools.partial(
            self.horde.jobs.pop, key, body, arrived=arrived, base_url=base_url, client=client
        )
        wait = body.get("wait") if isinstance(body, dict) else None
        if wait:  # a long poll: the worker may leave meanwhile
            answer = await request.unless_gone(pop)
        else:
            answer = await pop()
        return json_answer(_render.pop(answer))

    async def text_progress(self, request: Request) -> Answer:
        body = await request.json()
        answer = await self.horde.jobs.post_progress(request.api_key(), body)
        return json_answer(_render.progress(answer))

    async def text_submit(self, request: Request) -> Answer:
        body = await request.json()
        return json_answer(_render.submitted(await self.horde.jobs.submit(request.api_key(), body)))

    # Status and models -----------------------------------------------------------

    async def heartbeat(self, request: Request) -> Answer:
        return json_answer(self.horde.upkeep.heartbeat())

    async def status_models(self, request: Request) -> Answer:
        with_chat = (request.arg("chat") or "false").lower() in ("true", "1", "yes")
        page = parse_page(request.arg("page"))
        least = parse_count_bound("min_count", request.arg("min_count"))
        most = parse_count_bound("max_count", request.arg("max_count"))
        # The type defaults to image, as on the AI Horde: a text-only horde
        # serves no image model, so a client asking for those gets none.
        if request.arg("type", "image") != "text":
            return json_answer([])
        found = await self.horde.directory.model_page(page, with_chat)
        body = [
            _render.model(m)
            for m in found.models
            if (least is None or m.count >= least) and (most is None or m.count <= most)
        ]
        return paged(request, body, page, MODELS_PAGE, found.total)

    async def status_model(self, request: Request) -> Answer:
        # A list, as on the AI Horde: the model's entry, or none when no
        # online worker serves it.
        found = await self.horde.directory.model(request.params["name"])
        return json_answer([] if found is None else [_render.model(found)])

    # Workers -------------------------------------------------------------------

    async def workers(self, request: Request) -> Answer:
        # An empty type means every type (horde_sdk's default listing sends ``type=``).
        page = parse_page(request.arg("page"))
        if request.arg("type", "text") not in ("text", ""):
            return json_answer([])
        name = request.arg("name")
        if name:
            # The worker of this exact name, case-insensitively (horde_sdk's
            # worker_name), online or not: a list of it, or none.
            found_one = await self.horde.directory.named_worker(name)
            return json_answer([] if found_one is None else [_render.worker(found_one)])
        found = await self.horde.directory.worker_page(page)
        body = [_render.worker(w) for w in found.workers]
        return paged(request, body, page, WORKERS_PAGE, found.total)

    async def worker(self, request: Request) -> Answer:
        found = await self.horde.directory.worker(request.params["worker_id"])
        return json_answer(_render.worker(found))

    async def worker_update(self, request: Request) -> Answer:
        body = await request.json()
        update = self.horde.directory.update_worker
        client = request.client_address()  # an admin's moderation is audited from it
        return await keyed(request, "worker_id", update, _render.worker_update, body, client=client)

    async def worker_delete(self, request: Request) -> Answer:
        delete = self.horde.directory.delete_worker
        client = request.client_address()
        return await keyed(request, "worker_id", delete, _render.deleted_worker, client=client)

    async def worker_by_name(self, request: Request) -> Answer:
        found = await self.horde.directory.worker_by_name(request.params["name"])
        return json_answer(_render.worker(found))

    async def worker_messages(self, request: Request) -> Answer:
        page = parse_page(request.arg("page"))
        found = await self.horde.messages.listing(
            request.api_key(), request.arg("worker_id"), request.arg("validity"), page
        )
        return json_answer([_render.worker_message(m) for m in found])

    async def worker_message_send(self, request: Request) -> Answer:
        body = await request.json()
        sent = await self.horde.messages.send(
            request.api_key(), body, client=request.client_address()
        )
        return json_answer(_render.worker_message(sent))

    async def worker_message(self, request: Request) -> Answer:
        message_id = request.params["message_id"]
        found = await self.horde.messages.one(message_id)
        if found is None:
            raise HordeError(RC.MessageNotFound, f"No message with id {message_id[:64]!r}.")
        return json_answer(_render.worker_message(found))

    async def worker_message_delete(self, request: Request) -> Answer:
        message_id = request.params["message_id"]
        deleted = await self.horde.messages.delete(
            request.api_key(), message_id, client=request.client_address()
        )
        if not deleted:
            raise HordeError(RC.MessageNotFound, f"No message with id {message_id[:64]!r}.")
        return json_answer({"message": "OK"})

    # Users and kudos -----------------------------------------------------------

    async def find_user(self, request: Request) -> Answer:
        found = await self.horde.directory.find_user(request.api_key())
        # Found by a shared key: anyone's view of its lender (the AI Horde's).
        return json_answer(_render.user(found, private=found.via_shared_key is None))

    async def user(self, request: Request) -> Answer:
        found, private = await self.horde.directory.user_as_seen(
            request.params["user_id"], request.header("apikey")
        )
        return json_answer(_render.user(found, private=private))

    async def modify_user(self, request: Request) -> Answer:
        body = await request.json(optional=True)
        modify = self.horde.directory.modify_user
        client = request.client_address()  # an admin's change is audited from it
        return await keyed(request, "user_id", modify, _render.user_modified, body, client=client)

    async def users(self, request: Request) -> Answer:
        # Anyone's view of every user, a page at a time (KoboldAI Lite's ranking).
        page = parse_page(request.arg("page"))
        found = await self.horde.directory.user_page(page, request.arg("sort"))
        body = [_render.user(u, private=False) for u in found.users]
        return paged(request, body, page, USERS_PAGE, found.total)

    async def kudos_transfer(self, request: Request) -> Answer:
        body = await request.json()
        moved = await self.horde.directory.transfer_kudos(
            request.api_key(), body, request.operation_key()
        )
        return json_answer({"transferred": moved})


async def keyed(
    request: Request,
    param: str,
    call: Callable[Concatenate[str, str, P], Awaitable[T]],
    render: Callable[[T], Any],
    *args: P.args,
    **kwargs: P.kwargs,
) -> Answer:
    """The answer of a route acting under the caller's key on what the
    path's ``param`` names: the service's ``call`` of (key, that id, then
    ``args``, e.g. the body read first), rendered. The body is read before
    the key is looked at, so a bad body is refused ahead of a missing key
    on every such route alike."""
    found = await call(request.api_key(), request.params[param], *args, **kwargs)
    return json_answer(render(found))


def paged(request: Request, body: list[dict[str, Any]], page: int, size: int, total: int) -> Answer:
    """A page of a listing, still the AI Horde's JSON list, with how many
    entries there are in all (``X-Total-Count``) and, when more follow, the
    next page's URL (``Link: <...>; rel="next"``, the request's own query
    with the next page number). In UTF-8 rather than ``\\u`` escapes: a
    name's character then takes at most 6 bytes (a control character), not
    12 (a character outside the BMP), which halves the page's bound."""
    headers = [("X-Total-Count", str(total))]
    if page * size < total:
        query = [(k, v) for k, v in request.query() if k != "page"]
        query.append(("page", str(page + 1)))
        headers.append(("Link", f'<{request.path}?{urlencode(query)}>; rel="next"'))
    return json_answer(body, headers=headers, ensure_ascii=False)
