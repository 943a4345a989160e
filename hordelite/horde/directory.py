"""The directory: who is who in the horde. Users, workers (and an owner's
changes to its worker), and the models online workers serve."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hordelite.contract._fields import parse_uuid
from hordelite.contract.eligibility import WorkerView
from hordelite.contract.limits import MAX_USER_ID_DIGITS, MODEL_STATS_TTL
from hordelite.contract.presence import is_online
from hordelite.contract.unicode_rules import worker_name_key
from hordelite.errors import RC, HordeError, bad_request
from hordelite.horde import chat
from hordelite.horde._core import HordeCore
from hordelite.horde.keys import hash_key
from hordelite.horde.results import ModelStats, UserAnswer, WorkerAnswer, WorkerUpdate
from hordelite.storage.accounts import UserRecord
from hordelite.storage.pool import WorkerRecord

_ModelStatsEntry = tuple[float, tuple[tuple[ModelStats, ...], tuple[ModelStats, ...]]]


class Directory:
    """Users, workers and models, as the read routes and an owner see them."""

    def __init__(self, core: HordeCore) -> None:
        self._core = core
        self._model_stats: _ModelStatsEntry | None = None

    # Users -------------------------------------------------------------

    async def find_user(self, api_key: str) -> UserAnswer:
        """The key's user; an unknown key is 404 UserNotFound here, as on the AI Horde."""
        try:
            user = await self._core.store.user_by_key(key_hash=hash_key(api_key))
        except HordeError as exc:
            if exc.rc is RC.InvalidAPIKey:
                raise HordeError(RC.UserNotFound, "No user matches this API key.") from None
            raise
        return self._user_answer(user)

    async def user(self, user_id: str) -> UserAnswer:
        """The user with this id (decimal digits); 404 UserNotFound otherwise."""
        # isascii: str.isdigit() also accepts "²", which int() refuses.
        if not (user_id.isascii() and user_id.isdigit()) or len(user_id) > MAX_USER_ID_DIGITS:
            raise HordeError(RC.UserNotFound, f"No user with id {user_id[:64]!r}.")
        return self._user_answer(await self._core.store.user_by_id(user_id=int(user_id)))

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
        try:
            key = worker_name_key(name)
        except HordeError:
            key = None  # no worker can be named so (a control character, say)
        found = None if key is None else await self._core.store.worker_details(name_key=key)
        if found is None:
            raise HordeError(RC.WorkerNotFound, f"No worker named {name[:64]!r}.")
        return _worker_answer(found, self._core.clock.now())

    async def workers(self) -> list[WorkerAnswer]:
        """Every worker the horde knows."""
        now = self._core.clock.now()
        return [_worker_answer(w, now) for w in await self._core.store.list_workers(now=now)]

    async def update_worker(self, api_key: str, worker_id: str, body: Any) -> WorkerUpdate:
        """An owner's change to its worker: ``maintenance``, or ``online: false``."""
        canonical = parse_uuid(worker_id)
        if canonical is None:
            raise HordeError(RC.WorkerNotFound, f"No worker with id {worker_id[:64]!r}.")
        maintenance, online = _worker_changes(body)
        core = self._core
        changes = await core.store.update_worker(
            key_hash=hash_key(api_key),
            worker_id=canonical,
            maintenance=maintenance,
            offline_at=None if online is None else core.clock.now(),
        )
        await core.signals.notify_pool()  # in or out of maintenance, or gone
        return WorkerUpdate(changes.maintenance, changes.aborts_in_window, changes.online)

    # Models ------------------------------------------------------------

    async def model_stats(self, with_chat: bool = False) -> list[ModelStats]:
        """The models of online workers with their queues (cached for MODEL_STATS_TTL).

        ``with_chat`` adds each model's ``chat`` summary: its online chat
        workers, their largest limits and the sorted union of their features.
        """
        now = self._core.clock.now()
        if self._model_stats is None or now - self._model_stats[0] >= MODEL_STATS_TTL:
            self._model_stats = (now, await self._compute_model_stats(now))
        plain, with_summary = self._model_stats[1]
        return list(with_summary if with_chat else plain)

    async def _compute_model_stats(
        self, now: float
    ) -> tuple[tuple[ModelStats, ...], tuple[ModelStats, ...]]:
        """The entries without and with their chat summaries."""
        online = await self._core.pool.get(now)  # the pool snapshot: no read of its own
        queued = await self._core.store.model_queue_stats()
        threads: dict[str, int] = {}
        speed: dict[str, float] = {}
        for w in online:
            if w.maintenance:
                continue
            for model in w.models:
                threads[model] = threads.get(model, 0) + w.threads
                speed[model] = speed.get(model, 0.0) + w.speed * w.threads
        plain = []
        for model in sorted(threads):
            jobs, tokens = queued.get(model, (0, 0))
            plain.append(
                ModelStats(
                    name=model,
                    count=threads[model],
                    performance=round(speed[model] / threads[model], 1),
                    queued=tokens,
                    jobs=jobs,
                    eta=math.ceil(tokens / speed[model]) if speed[model] else 0,
                )
            )
        summary = chat.chat_summary(online)
        with_summary = tuple(
            dataclasses.replace(e, chat=summary[e.name]) if e.name in summary else e for e in plain
        )
        return tuple(plain), with_summary


def _worker_changes(body: Any) -> tuple[bool | None, bool | None]:
    """``maintenance`` and ``online`` of a worker update's body, checked."""
    if not isinstance(body, dict):
        raise HordeError(
            RC.BadRequest, "body: expected a JSON object", errors={"body": "expected a JSON object"}
        )
    maintenance = body.get("maintenance")
    if maintenance is not None and not isinstance(maintenance, bool):
        raise HordeError(
            RC.BadRequest,
            "maintenance: expected true or false",
            errors={"maintenance": "expected true or false"},
        )
    # hordelite extension: a worker that stops says so (``online: false``)
    # and leaves the pool at once; only its next pop brings it back.
    online = body.get("online")
    if online is not None and online is not False:
        raise bad_request("online", "only false is accepted: a pop brings a worker online")
    return maintenance, online


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
    )
