"""Messages to workers: an admin sends them, a worker's owner reads them,
the worker's pops carry the active ones (the AI Horde's worker messages)."""

from __future__ import annotations

from hordelite.contract._fields import parse_uuid
from hordelite.contract.worker_messages import hours_left, parse_message, parse_message_query
from hordelite.horde._core import HordeCore
from hordelite.horde.keys import hash_key
from hordelite.horde.results import WorkerMessage
from hordelite.storage.messages import MessageRecord


class Messages:
    def __init__(self, core: HordeCore) -> None:
        self._core = core

    async def send(self, api_key: str, body: object, *, client: str | None = None) -> WorkerMessage:
        """An admin's message, in the audit trail from the ``client`` address."""
        new = parse_message(body)
        core = self._core
        now = core.clock.now()
        sent = await core.store.send_message(
            key_hash=hash_key(api_key), new=new, now=now, address=client
        )
        await core.signals.notify_pool()  # every process's pops carry it from now
        return _answer(sent, now)

    async def listing(
        self, api_key: str, worker_id: str | None, validity: str | None, page: int
    ) -> list[WorkerMessage]:
        query = parse_message_query(worker_id, validity, page)
        now = self._core.clock.now()
        found = await self._core.store.list_messages(
            key_hash=hash_key(api_key), query=query, now=now
        )
        return [_answer(m, now) for m in found]

    async def one(self, message_id: str) -> WorkerMessage | None:
        canonical = parse_uuid(message_id)
        if canonical is None:
            return None
        found = await self._core.store.message(message_id=canonical)
        return None if found is None else _answer(found, self._core.clock.now())

    async def delete(self, api_key: str, message_id: str, *, client: str | None = None) -> bool:
        """An admin's delete, in the audit trail from the ``client`` address."""
        canonical = parse_uuid(message_id)
        core = self._core
        gone = canonical is not None and await core.store.delete_message(
            key_hash=hash_key(api_key),
            message_id=canonical,
            now=core.clock.now(),
            address=client,
        )
        if gone:
            await core.signals.notify_pool()
        return gone


async def for_pop(core: HordeCore, worker_id: str) -> tuple[WorkerMessage, ...]:
    """What a pop of this worker carries (from the message snapshot)."""
    now = core.clock.now()
    return tuple(_answer(m, now) for m in await core.messages.of(worker_id, now))


def _answer(m: MessageRecord, now: float) -> WorkerMessage:
    return WorkerMessage(m.id, m.worker_id, m.message, m.origin, hours_left(m.expires, now))
