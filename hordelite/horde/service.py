"""The horde: one object that owns a horde's state and its rooms.

Each room serves one audience and is what the routes call:

- ``requests`` (hordelite.horde.requests): a requester queues, reads and
  cancels requests;
- ``jobs`` (hordelite.horde.jobs): a worker pops, posts progress, submits;
- ``directory`` (hordelite.horde.directory): users, workers and models;
- ``about`` (hordelite.horde.about): the horde's load, the operator's
  news and documents;
- ``modes`` (hordelite.horde.modes): the horde's modes, as admins set them;
- ``messages`` (hordelite.horde.messages): an admin's messages to workers;
- ``shared_keys`` (hordelite.horde.shared_keys): the keys users lend;
- ``moderation`` (hordelite.horde.moderation): the admins' prompt filters
  (the requests' screen is ``requests``'s);
- ``readers`` (hordelite.horde.readers): the OpenAI calls as their
  requests' only readers, and the requests of calls a gone process held;
- ``upkeep`` (hordelite.horde.upkeep): the sweep, readiness, shutdown;
- ``webhooks`` (hordelite.horde.webhooks): the calls ended requests owe;
- ``operator`` (hordelite.horde.operator): the schema and new users;
- ``audit`` (hordelite.horde.audit_trail): the audit trail, as admins read it.
- ``review`` (hordelite.horde.moderation_review): the moderation review routes.

They share one HordeCore (hordelite.horde._core): configuration, the Store,
signals, clock, metrics and caches. ``Horde``'s own methods are the few that
hordelite.testing, the server and embedding code call on the horde as a
whole; each is one line into its room. Every room validates through
``hordelite.contract``, runs its transactions through the Store, signals
after commit, and raises HordeError for every refusal; routes only render.
"""

from __future__ import annotations

from typing import Any

from hordelite.blobs import BlobStore
from hordelite.clock import Clock, SystemClock
from hordelite.config import Config
from hordelite.contract.addresses import Policy
from hordelite.contract.budgets import Budget, Budgets
from hordelite.contract.chat_request import ChatRequest
from hordelite.contract.models import ModelReference
from hordelite.contract.suspicion import name_words
from hordelite.horde._core import HordeCore
from hordelite.horde.about import About
from hordelite.horde.addresses import Addresses
from hordelite.horde.admission import new_text_request
from hordelite.horde.audit_trail import AuditTrail
from hordelite.horde.directory import Directory
from hordelite.horde.jobs import Jobs
from hordelite.horde.keys import hash_key, new_api_key
from hordelite.horde.messages import Messages
from hordelite.horde.moderation import Moderation
from hordelite.horde.moderation_review import ModerationReview
from hordelite.horde.modes import ModesRoom
from hordelite.horde.operator import Operator
from hordelite.horde.readers import Readers
from hordelite.horde.requests import Requests, Submitter
from hordelite.horde.results import (
    PopAnswer,
    ProgressAnswer,
    Queued,
    Quote,
    RequestStatus,
    SubmitAnswer,
    UserAnswer,
)
from hordelite.horde.shared_keys import SharedKeys
from hordelite.horde.upkeep import Upkeep
from hordelite.horde.webhooks import Webhooks
from hordelite.signals import LocalSignals, Signals
from hordelite.storage.database import Database
from hordelite.storage.rules import Rules
from hordelite.storage.store import Store
from hordelite.storage.timers import SweepResult

__all__ = ["Horde", "hash_key", "new_api_key", "new_text_request"]


def rules_of(config: Config) -> Rules:
    """The storage rules the [horde] and [budgets] sections set."""
    h, b = config.horde, config.budgets
    return Rules(
        job_ttl=h.job_ttl,
        request_expiry=h.request_expiry,
        retention=h.retention,
        worker_online=h.worker_online,
        max_faults=h.max_faults,
        maintenance_aborts=h.maintenance_aborts,
        concurrency=h.concurrency,
        anonymous_concurrency=h.anonymous_concurrency,
        allow_anonymous=h.allow_anonymous,
        workers_per_user=b.workers_per_user,
        trusted_workers_per_user=b.trusted_workers_per_user,
        budgets=budgets_of(config),
        audit_retention=config.moderation.audit_retention,
        suspicious_tokens_per_second=config.moderation.suspicious_tokens_per_second,
        suspicious_name_words=name_words(config.moderation.suspicious_name_words),
        offences=offence_policy(config),
    )


def offence_policy(config: Config) -> Policy:
    """How offences time an address out, as [moderation] says."""
    m = config.moderation
    return Policy(
        first=m.offence_timeout,
        longest=m.offence_timeout_max,
        memory=m.offence_memory,
        refusals_per_offence=m.budget_refusals_per_offence,
    )


def budgets_of(config: Config) -> Budgets:
    """The per-user budgets of requests the [budgets] section sets."""
    b = config.budgets

    def role(prefix: str) -> Budget:
        return Budget(
            **{
                name: getattr(b, prefix + name)
                for name in (
                    "requests_per_minute",
                    "requests_held",
                    "stored_bytes",
                    "images_per_request",
                    "image_bytes",
                )
            }
        )

    return Budgets(anonymous=role("anonymous_"), user=role(""), trusted=role("trusted_"))


class Horde:
    """One horde: its state (``core``) and its rooms."""

    def __init__(
        self,
        config: Config,
        db: Database,
        *,
        clock: Clock | None = None,
        signals: Signals | None = None,
        models: ModelReference | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        models = models or ModelReference.load(config.horde.model_reference or None)
        signals = signals or LocalSignals()
        self.rules = rules_of(config)
        store = Store(db, self.rules, models.billions)
        clock = clock or SystemClock()
        self.core = HordeCore(config, store, signals, clock, models, blobs)
        self.requests = Requests(self.core)
        self.readers = Readers(self.core, self.requests)
        self.jobs = Jobs(self.core)
        self.directory = Directory(self.core)
        self.about = About(self.core)
        self.modes = ModesRoom(store, signals, self.core.modes, lambda: self.core.stopping)
        self.messages = Messages(self.core)
        self.shared_keys = SharedKeys(self.core)
        self.moderation = Moderation(self.core)
        self.upkeep = Upkeep(self.core)
        self.webhooks = Webhooks(
            self.core, lambda kind, rid: self.requests.status(kind, rid, with_position=False)
        )
        self.operator = Operator(self.core)
        self.addresses = Addresses(self.core.addresses, store, clock)
        self.audit = AuditTrail(self.core)
        self.review = ModerationReview(self.core)
        # What the routes and tests read of the horde's state.
        self.config = config
        self.db = db
        self.store = store
        self.signals = signals
        self.clock = self.core.clock
        self.models = models
        self.blobs = blobs
        self.metrics = self.core.metrics

    @property
    def stopping(self) -> bool:
        return self.core.stopping

    # The horde as a whole (server, hordelite.testing) ------------------

    def migrate(self) -> tuple[int, int]:
        return self.operator.migrate()

    async def create_user(
        self, username: str, *, kudos: float = 0.0, admin: bool = False, trusted: bool = False
    ) -> tuple[int, str]:
        return await self.operator.create_user(username, kudos=kudos, admin=admin, trusted=trusted)

    async def sweep(self, *, wait: bool = False) -> SweepResult:
        result = await self.upkeep.sweep(wait=wait)
        await self.readers.sweep()  # the requests of calls a gone process held
        return result

    def begin_shutdown(self) -> None:
        self.upkeep.begin_shutdown()

    # In-process calls, as embedding code and the ledger tests make them --

    async def submit_text(
        self, api_key: str, body: Any, client_agent: str, operation_key: str | None = None
    ) -> Queued | Quote:
        return await self.requests.submit_text(
            Submitter(api_key, client_agent, operation_key), body
        )

    async def submit_chat(
        self, api_key: str, body: Any, client_agent: str, operation_key: str | None = None
    ) -> Queued:
        return await self.requests.submit_chat(
            Submitter(api_key, client_agent, operation_key), body
        )

    async def queue_chat(
        self, api_key: str, req: ChatRequest, client_agent: str, operation_key: str | None = None
    ) -> Queued:
        return await self.requests.queue_chat(Submitter(api_key, client_agent, operation_key), req)

    async def text_status(
        self, request_id: str, *, cancel: bool = False, wait: float = 0.0
    ) -> RequestStatus:
        """The status; ``cancel`` is ``requests.cancel`` (the native DELETE)."""
        if cancel:
            return await self.requests.cancel("text", request_id)
        return await self.requests.status("text", request_id, wait=wait)

    async def chat_status(
        self,
        request_id: str,
        *,
        cancel: bool = False,
        with_position: bool = True,
        with_free_threads: bool = False,
        wait: float = 0.0,
    ) -> RequestStatus:
        """The status; ``cancel`` is ``requests.cancel`` (the native DELETE)."""
        if cancel:
            return await self.requests.cancel("chat", request_id)
        return await self.requests.status(
            "chat",
            request_id,
            with_position=with_position,
            with_free_threads=with_free_threads,
            wait=wait,
        )

    async def pop(
        self, api_key: str, body: Any, *, arrived: float | None = None, base_url: str = ""
    ) -> PopAnswer:
        return await self.jobs.pop(api_key, body, arrived=arrived, base_url=base_url)

    async def post_progress(self, api_key: str, body: Any) -> ProgressAnswer:
        return await self.jobs.post_progress(api_key, body)

    async def submit(self, api_key: str, body: Any) -> SubmitAnswer:
        return await self.jobs.submit(api_key, body)

    async def find_user(self, api_key: str) -> UserAnswer:
        return await self.directory.find_user(api_key)
