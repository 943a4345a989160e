"""The directory: who is who in the horde. Users, workers (and an owner's
changes to its worker), and the models online workers serve."""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import OrderedDict
from typing import Any

import anyio

from hordelite.contract._fields import parse_uuid
from hordelite.contract.eligibility import WorkerView
from hordelite.contract.limits import (
    DASHBOARD_CHAT_MODELS,
    DASHBOARD_MODELS,
    DASHBOARD_POOL_SECONDS,
    DASHBOARD_WORKERS,
    MAX_USER_ID_DIGITS,
    MODEL_STATS_TTL,
    MODELS_PAGE,
    USERS_PAGE,
    WORKERS_PAGE,
)
from hordelite.contract.presence import is_online
from hordelite.contract.transfers import parse_transfer
from hordelite.contract.unicode_rules import worker_name_key
from hordelite.contract.user_edit import parse_user_edit
from hordelite.contract.worker_edit import parse_worker_edit
from hordelite.errors import RC, HordeError, bad_request
from hordelite.horde import chat
from hordelite.horde._core import HordeCore
from hordelite.horde.keys import hash_key, scoped_operation_key
from hordelite.horde.results import (
    DeletedWorkerAnswer,
    ModelPage,
    ModelStats,
    PoolOverview,
    UserAnswer,
    UserListing,
    UserModified,
    WorkerAnswer,
    WorkerListing,
    WorkerUpdate,
)
from hordelite.horde.shared_keys import lent_key_ids
from hordelite.storage.accounts import UserRecord
from hordelite.storage.pool import ServedModel, WorkerRecord

# How GET /users may sort (the AI Horde's).
USER_SORTS = ("kudos", "age")

# Pages of the model list kept (the most recently read): a client may ask
# for any page, so the cache must not grow with the pages asked for.
_MODEL_PAGES_KEPT = 8


class Directory:
    """Users, workers and models, as the read routes and an owner see them."""

    def __init__(self, core: HordeCore) -> None:
        self._core = core
        # (page, page size) -> (read at, entries, models served in all)
        self._model_pages: OrderedDict[
            tuple[int, int], tuple[float, tuple[ModelStats, ...], int]
        ] = OrderedDict()
        self._model_lock = anyio.Lock()
        self._chat: tuple[float, dict[str, dict[str, Any]]] | None = None
        self._overview: tuple[float, PoolOverview] | None = None
        self._overview_lock = anyio.Lock()

    # Users -------------------------------------------------------------

    async def find_user(self, api_key: str) -> UserAnswer:
        """The key's user, with the ids of the shared keys it lent; for a
        shared key its lender, as anyone sees it (``via_shared_key``), as
        on the AI Horde. An unknown key is 404 UserNotFound here, as there."""
        store = self._core.store
        key_hash = hash_key(api_key)
        try:
            user = await store.user_by_key(key_hash=key_hash)
        except HordeError as exc:
            if exc.rc is not RC.InvalidAPIKey:
                raise
            try:
                lender = await store.requester_by_key(key_hash=key_hash, now=None)
                lent = await store.shared_key(key_hash=key_hash)
            except HordeError as again:
                if again.rc is RC.InvalidAPIKey:
                    raise HordeError(RC.UserNotFound, "No user matches this API key.") from None
                raise
            return dataclasses.replace(self._user_answer(lender), via_shared_key=lent.name)
        ids = () if user.anonymous else await lent_key_ids(self._core, api_key, user.id)
        return dataclasses.replace(self._user_answer(user), sharedkey_ids=ids)

    async def user(self, user_id: str) -> UserAnswer:
        """The user with this id (decimal digits); 404 UserNotFound otherwise."""
        # isascii: str.isdigit() also accepts "²", which int() refuses.
        if not (user_id.isascii() and user_id.isdigit()) or len(user_id) > MAX_USER_ID_DIGITS:
            raise HordeError(RC.UserNotFound, f"No user with id {user_id[:64]!r}.")
        return self._user_answer(await self._core.store.user_by_id(user_id=int(user_id)))

    async def modify_user(
        self, api_key: str, user_id: str, body: object, *, client: str | None = None
    ) -> UserModified:
        """``PUT /users/{id}``: an admin's change of a user, or a user's own
        new name (hordelite.contract.user_edit). An admin's change is in the
        audit trail with the ``client`` address it came from."""
        edit = parse_user_edit(body)
        if not (user_id.isascii() and user_id.isdigit()) or len(user_id) > MAX_USER_ID_DIGITS:
            raise HordeError(RC.UserNotFound, f"No user with id {user_id[:64]!r}.")
        user = await self._core.store.modify_user(
            key_hash=hash_key(api_key),
            user_id=int(user_id),
            edit=edit,
            now=self._core.clock.now(),
            address=client,
        )
        return UserModified(edit, self._user_answer(user))

    async def user_as_seen(self, user_id: str, api_key: str | None) -> tuple[UserAnswer, bool]:
        """``GET /users/{id}``: the user, and whether the key's user sees its
        private fields: it is that user (who also sees the ids of the shared
        keys it lent), or an admin. A key that matches no user is 401."""
        found = await self.user(user_id)
        if not api_key:
            return found, False
        viewer = await self._core.store.user_by_key(key_hash=hash_key(api_key))
        if viewer.id == found.id and not viewer.anonymous:
            ids = await lent_key_ids(self._core, api_key, found.id)
            return dataclasses.replace(found, sharedkey_ids=ids), True
        return found, viewer.id == found.id or viewer.admin

    def _user_answer(self, user: UserRecord) -> UserAnswer:
        concurrency = user.concurrency
        if concurrency is None:
            h = self._core.config.horde
            concurrency = h.anonymous_concurrency if user.anonymous else h.concurrency
        return UserAnswer(
            id=user.id,
            username=user.username,
            kudos=round(user.kudos, 2),
            kudos_earned=round(user.kudos_earned, 2),
            concurrency=concurrency,
            worker_ids=user.worker_ids,
            trusted=user.trusted,
            moderator=user.admin,
            kudos_gifted=round(user.kudos_gifted, 2),
            kudos_received=round(user.kudos_received, 2),
            account_age=max(int(self._core.clock.now() - user.created), 0),
        )

    async def user_page(self, page: int, sort: str | None) -> UserListing:
        """The users of page ``page`` (from 1), USERS_PAGE a page, sorted by
        ``sort``: ``kudos`` (the default, most first) or ``age`` (oldest first)."""
        sort = "kudos" if sort is None else sort
        if sort not in USER_SORTS:
            raise bad_request("sort", "must be kudos or age")
        found, total = await self._core.store.user_page(
            by_kudos=sort == "kudos", limit=USERS_PAGE, offset=(page - 1) * USERS_PAGE
        )
        return UserListing(tuple(self._user_answer(u) for u in found), total)

    async def transfer_kudos(
        self, api_key: str, body: Any, operation_key: str | None = None
    ) -> float:
        """Kudos from the key's user to another (``contract.transfers``); the
        amount moved. A retry under the same ``operation_key``
        (Idempotency-Key) answers the first transfer and moves nothing."""
        transfer = parse_transfer(body)
        return await self._core.store.transfer_kudos(
            key_hash=hash_key(api_key),
            transfer=transfer,
            now=self._core.clock.now(),
            operation_key=scoped_operation_key(api_key, operation_key),
        )

    # Workers -----------------------------------------------------------

    async def online_workers(self, now: float) -> list[WorkerView]:
        """The online workers, from the pool snapshot (no read of its own
        while it is current)."""
        return await self._core.pool.get(now)

    async def worker(self, worker_id: str) -> WorkerAnswer:
        """The worker with this id; 404 WorkerNotFound otherwise."""
        canonical = parse_uuid(worker_id)
        store = self._core.store
        found = None if canonical is None else await store.worker_details(worker_id=canonical)
        if found is None:
            raise HordeError(RC.WorkerNotFound, f"No worker with id {worker_id[:64]!r}.")
        return _worker_answer(found, self._core.clock.now())

    async def worker_by_name(self, name: str) -> WorkerAnswer:
        """The worker whose name has the same key (``worker_name_key``): any
        case or look-alike spelling of its name finds it."""
        found = await self.named_worker(name)
        if found is None:
            raise HordeError(RC.WorkerNotFound, f"No worker named {name[:64]!r}.")
        return found

    async def named_worker(self, name: str) -> WorkerAnswer | None:
        """``worker_by_name``, None when there is none."""
        try:
            key = worker_name_key(name)
        except HordeError:
            return None  # no worker can be named so (a control character, say)
        found = await self._core.store.worker_details(name_key=key)
        return None if found is None else _worker_answer(found, self._core.clock.now())

    async def worker_page(self, page: int = 1) -> WorkerListing:
        """The online workers of page ``page`` (from 1), WORKERS_PAGE a page by name."""
        now = self._core.clock.now()
        found = await self._core.store.worker_page(
            now=now, limit=WORKERS_PAGE, offset=(page - 1) * WORKERS_PAGE
        )
        return WorkerListing(tuple(_worker_answer(w, now) for w in found.workers), found.total)

    async def update_worker(
        self, api_key: str, worker_id: str, body: Any, *, client: str | None = None
    ) -> WorkerUpdate:
        """An owner's change to its worker (``contract.worker_edit``):
        ``maintenance``, ``info``, ``name``, ``team`` ``""``, ``online:
        false``; an admin's ``paused``. An admin's moderation is in the
        audit trail with the ``client`` address it came from."""
        canonical = _worker_id(worker_id)
        edit = parse_worker_edit(body)
        core = self._core
        changes = await core.store.update_worker(
            key_hash=hash_key(api_key),
            worker_id=canonical,
            edit=edit,
            now=core.clock.now(),
            address=client,
        )
        await core.signals.notify_pool()  # in or out of maintenance, paused, or gone
        return WorkerUpdate(
            changes.maintenance,
            changes.aborts_in_window,
            changes.online,
            info=changes.info,
            name=changes.name,
            paused=changes.paused,
            team=changes.team,
        )

    async def delete_worker(
        self, api_key: str, worker_id: str, *, client: str | None = None
    ) -> DeletedWorkerAnswer:
        """The owner deletes its worker (an admin, any): the jobs it held go
        back to the queue at once, as when their lease runs out. An admin's
        delete of another's worker is in the audit trail, from ``client``."""
        canonical = _worker_id(worker_id)
        core = self._core
        now = core.clock.now()
        gone = await core.store.delete_worker(
            key_hash=hash_key(api_key), worker_id=canonical, now=now, address=client
        )
        if gone.job_ids:
            core.metrics.faults.labels("lease_expired").inc(len(gone.job_ids))
        for job_id in gone.job_ids:
            await core.signals.end_lease(job_id, now)
        await core.signals.notify_pool()
        if gone.requeued:
            await core.queue_changed()
        for request_id in gone.ended:
            await core.signals.notify_request(request_id)
        if gone.ended:
            core.webhooks_due.set()
        for request_id in gone.requeued:
            await core.signals.touch_request(request_id)
        return DeletedWorkerAnswer(gone.id, gone.name)

    # Models ------------------------------------------------------------

    async def model_page(self, page: int = 1, with_chat: bool = False) -> ModelPage:
        """The models of online workers with their queues, MODELS_PAGE a page
        (from 1), most threads first: each page read at most once per
        MODEL_STATS_TTL, and only the page's rows come back from the database.

        ``with_chat`` adds each model's ``chat`` summary: its online chat
        workers, their largest limits and the sorted union of their features.
        """
        entries, total = await self._models(page, MODELS_PAGE)
        if with_chat:
            summary = await self.chat_summary()
            entries = tuple(
                dataclasses.replace(e, chat=summary[e.name]) if e.name in summary else e
                for e in entries
            )
        return ModelPage(entries, total)

    async def model(self, name: str) -> ModelStats | None:
        """The model ``name`` with its queue, None when no online worker out
        of maintenance serves it."""
        found = await self._core.store.served_model(now=self._core.clock.now(), name=name)
        return None if found is None else _model_stats(found)

    async def _models(self, page: int, size: int) -> tuple[tuple[ModelStats, ...], int]:
        now = self._core.clock.now()
        key = (page, size)
        async with self._model_lock:  # one read for every caller that needs it fresh
            cached = self._model_pages.get(key)
            if cached is None or now - cached[0] >= MODEL_STATS_TTL:
                found = await self._core.store.served_models(
                    now=now, limit=size, offset=(page - 1) * size
                )
                cached = (now, tuple(_model_stats(m) for m in found.models), found.total)
                self._model_pages[key] = cached
            self._model_pages.move_to_end(key)
            while len(self._model_pages) > _MODEL_PAGES_KEPT:
                self._model_pages.popitem(last=False)
        return cached[1], cached[2]

    async def chat_summary(self) -> dict[str, dict[str, Any]]:
        """Per chat model of the online workers out of maintenance, by name:
        its chat workers, their largest limits and the union of their
        features (from the pool snapshot; at most one model a worker)."""
        now = self._core.clock.now()
        if self._chat is None or now - self._chat[0] >= MODEL_STATS_TTL:
            summary = chat.chat_summary(await self._core.pool.get(now))
            self._chat = (now, dict(sorted(summary.items())))
        return self._chat[1]

    async def pool_overview(self) -> PoolOverview:
        """What the dashboard shows of the pool, each list capped (``PoolOverview``),
        computed at most once per DASHBOARD_POOL_SECONDS."""
        async with self._overview_lock:  # one computation for every page polling it
            now = self._core.clock.now()
            if self._overview is None or now - self._overview[0] >= DASHBOARD_POOL_SECONDS:
                self._overview = (now, await self._compute_overview(now))
            return self._overview[1]

    async def _compute_overview(self, now: float) -> PoolOverview:
        models, models_total = await self._models(1, DASHBOARD_MODELS)
        summary = await self.chat_summary()
        busiest = await self._core.store.worker_page(
            now=now, limit=DASHBOARD_WORKERS, offset=0, busiest=True
        )
        # The playground reaches only what /v1 can name: chat models without a colon.
        reachable = [(-e["workers"], name) for name, e in summary.items() if ":" not in name]
        offered = heapq.nsmallest(DASHBOARD_CHAT_MODELS, reachable)
        return PoolOverview(
            models=tuple(
                dataclasses.replace(e, chat=summary[e.name]) if e.name in summary else e
                for e in models
            ),
            models_total=models_total,
            workers=tuple(_worker_answer(w, now) for w in busiest.workers),
            workers_total=busiest.total,
            chat_models=tuple(name for _, name in offered),
            chat_models_total=len(reachable),
        )


def _model_stats(m: ServedModel) -> ModelStats:
    return ModelStats(
        name=m.name,
        count=m.threads,
        performance=round(m.speed / m.threads, 1) if m.threads else 0.0,
        queued=m.tokens,
        jobs=m.jobs,
        eta=math.ceil(m.tokens / m.speed) if m.speed else 0,
        workers=m.workers,
    )


def _worker_id(worker_id: str) -> str:
    """The worker id of a path, canonical; 404 WorkerNotFound for one that is not a UUID."""
    canonical = parse_uuid(worker_id)
    if canonical is None:
        raise HordeError(RC.WorkerNotFound, f"No worker with id {worker_id[:64]!r}.")
    return canonical


def _worker_answer(w: WorkerRecord, now: float) -> WorkerAnswer:
    return WorkerAnswer(
        id=w.id,
        name=w.name,
        owner=w.owner,
        online=is_online(w.online_until, now),
        trusted=w.trusted,
        maintenance=w.maintenance,
        nsfw=w.nsfw,
        threads=w.threads,
        models=w.models,
        max_length=w.max_length,
        max_context_length=w.max_context_length,
        bridge_agent=w.bridge_agent,
        uptime=w.uptime,
        requests_fulfilled=w.requests_fulfilled,
        uncompleted_jobs=w.uncompleted_jobs,
        kudos_rewards=round(w.kudos_rewards, 2),
        speed=w.tokens_generated / w.seconds_generating if w.seconds_generating else 0.0,
        prompt_jobs=w.prompt_jobs,
        nonconformant_replies=w.nonconformant_replies,
        chat=w.chat,
        info=w.info,
        paused=w.paused,
        tokens_generated=int(w.tokens_generated),
    )
