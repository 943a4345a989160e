"""Storage's one interface: ``Store``, the operations the horde asks of its database.

Each operation is a method with a name, keyword-only typed parameters and
the frozen record it answers; each runs one transaction of a
function over a ``Tx`` from the modules beside this one (``queries``
names them), which stay its implementation. The Store holds what every
operation would otherwise be passed: the horde's ``Rules`` and the model
sizes (``billions``). How rows are locked is the database's affair: a pop
on PostgreSQL skips requests other pops hold locked, on SQLite there are
none to skip; no caller says which.

The operator's operations (``hordelite keys``, ``kudos``, ``workers``)
are synchronous: the CLI runs them in its own thread, as it runs ``migrate``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from hordelite.contract.addresses import Rule
from hordelite.contract.audit_query import AuditQuery
from hordelite.contract.chat_admission import AdmissionPlan, Capacity
from hordelite.contract.chat_reply import ChatSubmit, Verdict
from hordelite.contract.eligibility import RequestView, WorkerView
from hordelite.contract.filters import FilterEdit, FilterSpec, Screened
from hordelite.contract.moderation_review import OverviewQuery, PromptQuery, SuspicionQuery
from hordelite.contract.modes import Modes
from hordelite.contract.shared_keys import SharedKeyEdit, SharedKeyTerms
from hordelite.contract.text import JobSubmit, PopRequest
from hordelite.contract.transfers import Transfer
from hordelite.contract.user_edit import UserEdit
from hordelite.contract.worker_edit import WorkerEdit
from hordelite.contract.worker_messages import MessageQuery, NewMessage
from hordelite.errors import RC, HordeError
from hordelite.storage import addresses, admin, audit, messages, modes, shared_keys, webhooks
from hordelite.storage import filters as filter_rows
from hordelite.storage import moderation_review as review
from hordelite.storage import queries as q
from hordelite.storage.accounts import modify_user, transfer_kudos, user_page
from hordelite.storage.activity import Bucket, done_jobs_per_bucket
from hordelite.storage.database import Database
from hordelite.storage.ledger import SubmitResult
from hordelite.storage.messages import MessageRecord
from hordelite.storage.migrations import upgrade
from hordelite.storage.requests import (
    ImageHoldings,
    SubmittedText,
    image_holdings,
    submitted_text,
)
from hordelite.storage.shared_keys import SharedKeyRecord
from hordelite.storage.stats import HordeLoad, TextStats, horde_load, text_stats
from hordelite.storage.webhooks import OwedCall

T = TypeVar("T")


class Store:
    """Storage's one interface: every operation the horde (and its operator)
    asks of the database, each one transaction, each answering a record."""

    def __init__(self, db: Database, rules: q.Rules, billions: Callable[[str], float]) -> None:
        self.db = db
        self.rules = rules
        self.billions = billions

    # Set-up --------------------------------------------------------------

    def migrate(self, *, anonymous_key_hash: str, now: float) -> tuple[int, int]:
        """Bring the schema up to date and create the anonymous user once; the
        schema versions before and after (synchronous: run at start-up)."""
        result = self.db.run_sync(upgrade, True)
        self.db.run_sync(q.ensure_anonymous, True, anonymous_key_hash, now)
        return result

    # The audit trail (decision 0077) ------------------------------------

    def record_audit_sync(
        self,
        *,
        actor: audit.Actor,
        action: str,
        target: str,
        now: float,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """One entry in a transaction of its own, without a loop (what the
        trail's readers are tested on; every action records its entry in
        its own change's transaction, ``audit.record``)."""
        self.db.run_sync(audit.record, True, actor, action, target, now, detail)

    def audit_entries(self, *, query: AuditQuery) -> list[audit.AuditEntry]:
        """A page of the trail, newest first (``audit.entries``);
        synchronous, for the CLI."""
        return self.db.run_sync(audit.entries, False, query)

    async def read_audit(self, *, query: AuditQuery) -> list[audit.AuditEntry]:
        """``audit_entries`` from a loop, for the horde's own reads (an
        admin's read through the routes is ``admin_audit``, which checks
        the key)."""
        return await self.db.read(audit.entries, query)

    async def admin_audit(self, *, key_hash: str, query: AuditQuery) -> list[audit.AuditEntry]:
        """A page of the trail for an admin (the admin route); raises
        InvalidAPIKey, NotModerator for anyone else."""
        return await self.db.read(admin.admin_audit, key_hash, self.rules, query)

    # The horde's modes (hordelite.contract.modes) ------------------------

    async def read_modes(self) -> Modes:
        """The modes as stored (all off before they were first set)."""
        return await self.db.read(modes.read_modes)

    async def modes_for(self, *, key_hash: str) -> Modes:
        """The modes, for an admin's key; raises InvalidAPIKey, NotModerator."""
        return await self.db.read(modes.modes_for, key_hash, self.rules)

    async def set_modes(
        self, *, key_hash: str, changes: Mapping[str, bool], address: str, now: float
    ) -> tuple[Modes, Modes]:
        """An admin sets modes (audited ``mode.set`` in the same transaction);
        the modes before and after; raises InvalidAPIKey, NotModerator."""
        return await self.db.write(
            modes.modes_as_admin, key_hash, changes, address, self.rules, now
        )

    async def may_register(self, *, key_hash: str, name_key: str) -> bool:
        """Whether this pop may go on while the horde is closed to new
        workers (``modes.may_register``)."""
        return await self.db.read(modes.may_register, key_hash, name_key)

    def read_modes_sync(self) -> Modes:
        """``read_modes`` for the CLI."""
        return self.db.run_sync(modes.read_modes, False)

    def set_modes_sync(self, *, changes: Mapping[str, bool], now: float) -> tuple[Modes, Modes]:
        """The operator sets modes at the shell (audited as ``cli``)."""
        return self.db.run_sync(modes.set_modes, True, changes, audit.CLI_ACTOR, now)

    # Timeouts and blocks by address (contract.addresses) ----------------

    async def address_version(self) -> int:
        """The version of the address rules: one read by primary key."""
        return await self.db.read(addresses.version)

    async def address_rules(self, *, now: float) -> tuple[int, list[Rule]]:
        """The rules' version and the rules in force at ``now``."""
        return await self.db.read(addresses.in_force, now)

    async def listed_address_rules(self, *, key_hash: str, now: float) -> list[Rule]:
        """The rules in force, for an admin; raises InvalidAPIKey, NotModerator."""
        return await self.db.read(addresses.listed, key_hash, self.rules, now)

    async def set_address_rule(
        self, *, key_hash: str, client: str | None, target: str, until: float | None, now: float
    ) -> Rule:
        """An admin's timeout (``until`` a moment) or block (None) of
        ``target``, audited; raises InvalidAPIKey, NotModerator."""
        return await self.db.write(
            addresses.by_admin, key_hash, self.rules, client, addresses.set_rule, target, until, now
        )

    async def lift_address_rule(
        self, *, key_hash: str, client: str | None, target: str, now: float
    ) -> bool:
        """An admin's lift of ``target``'s rule, audited; whether it had one."""
        return await self.db.write(
            addresses.by_admin, key_hash, self.rules, client, addresses.lift, target, now
        )

    async def block_worker_address(
        self, *, key_hash: str, client: str | None, worker_id: str, seconds: float, now: float
    ) -> str:
        """An admin's timeout of the address a worker last popped from,
        audited; the address. Raises WorkerNotFound, BadRequest (no address)."""
        return await self.db.write(
            addresses.by_admin,
            key_hash,
            self.rules,
            client,
            addresses.block_worker,
            worker_id,
            seconds,
            now,
        )

    async def unblock_worker_address(
        self, *, key_hash: str, client: str | None, worker_id: str, now: float
    ) -> str:
        """An admin's lift of a worker's address, audited; the address."""
        return await self.db.write(
            addresses.by_admin,
            key_hash,
            self.rules,
            client,
            addresses.unblock_worker,
            worker_id,
            now,
        )

    async def address_offence(self, *, client: str, kind: str, now: float) -> Rule | None:
        """A refusal of ``kind`` counted against ``client``: the timeout it
        earned, or None."""
        return await self.db.write(addresses.offend, client, kind, now, self.rules.offences)

    def address_rules_sync(self, *, now: float) -> list[Rule]:
        """The rules in force, for the CLI."""
        return self.db.run_sync(addresses.in_force, False, now)[1]

    def set_address_rule_sync(self, *, target: str, until: float | None, now: float) -> Rule:
        """The operator's timeout or block from the shell, audited as ``cli``."""
        return self.db.run_sync(addresses.set_rule, True, audit.CLI_ACTOR, target, until, now)

    def lift_address_rule_sync(self, *, target: str, now: float) -> bool:
        """The operator's lift from the shell, audited as ``cli``."""
        return self.db.run_sync(addresses.lift, True, audit.CLI_ACTOR, target, now)

    # Prompt filters (docs/reference/filters.md) ----------------------------
    # ``key_hash`` None: the operator at the shell (the CLI's, synchronous).

    async def filter_revision(self) -> int:
        """The filters' revision (one row): what a process checks its
        compiled filters against."""
        return await self.db.read(filter_rows.revision)

    async def every_filter(self) -> filter_rows.FilterRules:
        """Every filter with the revision it was read at, for the
        process's compiled set."""
        return await self.db.read(filter_rows.every_filter)

    async def list_filters(
        self, *, key_hash: str | None, filter_type: int | None, contains: str | None
    ) -> list[filter_rows.FilterRecord]:
        """The filters of ``filter_type`` whose regex or description holds
        ``contains`` (None: any), for an admin; raises InvalidAPIKey,
        NotModerator."""
        return await self.db.read(
            filter_rows.list_filters, key_hash, self.rules, filter_type, contains
        )

    async def one_filter(self, *, key_hash: str | None, filter_id: int) -> filter_rows.FilterRecord:
        """One filter, for an admin; raises FilterNotFound, NotModerator."""
        return await self.db.read(filter_rows.one_filter, key_hash, self.rules, filter_id)

    async def create_filter(
        self, *, key_hash: str | None, spec: FilterSpec, address: str, now: float
    ) -> tuple[filter_rows.FilterRecord, bool]:
        """An admin's new filter (audited ``filter.create``), or the one
        with its regex and type already; whether it is new."""
        return await self.db.write(
            filter_rows.create_filter, key_hash, self.rules, spec, address, now
        )

    async def edit_filter(
        self, *, key_hash: str | None, filter_id: int, edit: FilterEdit, address: str, now: float
    ) -> filter_rows.FilterRecord:
        """An admin's change of a filter (audited ``filter.edit``); the
        filter as changed."""
        return await self.db.write(
            filter_rows.edit_filter, key_hash, self.rules, filter_id, edit, address, now
        )

    async def delete_filter(
        self, *, key_hash: str | None, filter_id: int, address: str, now: float
    ) -> None:
        """An admin's deletion of a filter (audited ``filter.delete``)."""
        await self.db.write(
            filter_rows.delete_filter, key_hash, self.rules, filter_id, address, now
        )

    async def record_screened(self, *, key_hash: str, screened: Screened, now: float) -> None:
        """A request refused or flagged by filters, in the audit trail."""
        await self.db.write(filter_rows.record_screened, key_hash, self.rules, screened, now)

    # The moderation review routes (hordelite.storage.moderation_review):
    # each for an admin's key; raises InvalidAPIKey, NotModerator.

    async def paused_workers(
        self, *, key_hash: str, query: OverviewQuery, now: float
    ) -> tuple[list[review.PausedWorker], int]:
        """The paused workers the query asks for, and how many in all."""
        return await self.db.read(review.paused_workers, key_hash, self.rules, query, now)

    async def prompt_events(
        self, *, key_hash: str, query: PromptQuery
    ) -> tuple[list[audit.AuditEntry], dict[int, list[review.Note]]]:
        """A page of prompt events (refused and flagged requests' entries)
        and each one's notes."""
        return await self.db.read(review.prompt_events, key_hash, self.rules, query)

    async def add_prompt_note(
        self, *, key_hash: str, event_id: int, note: str, address: str, now: float
    ) -> review.Note:
        """Also 404 PromptEventNotFound; audited ``prompt.note``."""
        return await self.db.write(
            review.add_note, key_hash, self.rules, event_id, note, address, now
        )

    async def suspicion_events(
        self, *, key_hash: str, query: SuspicionQuery
    ) -> list[tuple[audit.AuditEntry, int | None]]:
        """A page of ``worker.suspicion`` entries, each with its worker's owner."""
        return await self.db.read(review.suspicion_events, key_hash, self.rules, query)

    def filters_sync(
        self, *, fn: Callable[..., T], args: tuple[Any, ...] = (), write: bool = False
    ) -> T:
        """The CLI's filter operations (``hordelite filters``): ``fn`` of
        storage.filters run as the operator at the shell (no key)."""
        return self.db.run_sync(fn, write, None, self.rules, *args)

    async def ping(self) -> None:
        """One round trip to the database; raises StorageUnavailable."""
        await self.db.ping()

    # Users ---------------------------------------------------------------

    async def create_user(
        self, *, username: str, key_hash: str, kudos: float, admin: bool, trusted: bool, now: float
    ) -> int:
        """A new user with this key hash; its id."""
        return await self.db.write(q.create_user, username, key_hash, kudos, admin, trusted, now)

    async def user_by_key(self, *, key_hash: str) -> q.UserRecord:
        """The key's user; raises InvalidAPIKey (AnonymousDisabled for the anonymous key when off)."""
        return await self.db.read(q.user_by_key, key_hash, self.rules)

    async def image_holdings(
        self, *, key_hash: str, client: str | None, now: float
    ) -> ImageHoldings:
        """The key's user and the image bytes its requests hold (decision
        0070; an anonymous client's, decision 0071); raises InvalidAPIKey,
        AnonymousDisabled, and 429 RequestRateExceeded past its rate."""
        return await self.db.read(image_holdings, key_hash, client, now, self.rules)

    async def requester_by_key(
        self,
        *,
        key_hash: str,
        now: float | None,
        max_length: int | None = None,
        quote: float | None = None,
    ) -> q.UserRecord:
        """The user a request sent with this key is queued for: the key's
        user, or a shared key's lender, the key checked as admission would
        (storage.shared_keys.requester_by_key)."""
        return await self.db.read(
            shared_keys.requester_by_key, key_hash, self.rules, now, max_length, quote
        )

    async def user_by_id(self, *, user_id: int) -> q.UserRecord:
        """The user with this id; raises UserNotFound."""
        return await self.db.read(q.user_by_id, user_id)

    async def user_page(
        self, *, by_kudos: bool, limit: int, offset: int
    ) -> tuple[list[q.UserRecord], int]:
        """A page of every user (most kudos first, or oldest first) and how
        many there are."""
        return await self.db.read(user_page, by_kudos, limit, offset)

    async def transfer_kudos(
        self, *, key_hash: str, transfer: Transfer, now: float, operation_key: str | None
    ) -> float:
        """The kudos moved from the key's user to another (once per
        ``operation_key``); raises the AI Horde's transfer refusals
        (KudosTransferNotEnough, ...) and OperationKeyReused."""
        return await self.db.write(
            transfer_kudos, key_hash, transfer, self.rules, now, operation_key
        )

    # Requests ------------------------------------------------------------

    async def submit_request(
        self,
        *,
        key_hash: str,
        new: q.NewRequest,
        request_id: str,
        now: float,
        upfront_max_length: int,
        client_agent: str,
        online: list[WorkerView] | None,
        reader: str | None = None,
        client: str | None = None,
    ) -> q.Submitted:
        """The request queued, or the one its operation key queued first; raises
        the submit refusals (InvalidAPIKey, KudosUpfront, OperationKeyReused...).
        ``reader``: the process holding the OpenAI call that is its only reader;
        ``client``: the address an anonymous request's budgets count."""
        return await self.db.write(
            q.submit_request,
            key_hash,
            new,
            request_id,
            now,
            self.rules,
            upfront_max_length,
            client_agent,
            online,
            reader,
            client,
        )

    async def count_refusal(self, *, key_hash: str, client: str | None, now: float) -> None:
        """A budget refusal of the key's request, counted toward its rate."""
        await self.db.write(q.count_refusal, key_hash, client, now, self.rules)

    async def first_request(
        self, *, key_hash: str, operation_key: str, kind: str, fingerprint: str | None
    ) -> q.FirstRequest | None:
        """The request the key's user queued under ``operation_key`` (None: none);
        raises InvalidAPIKey, and 409 OperationKeyReused for a different request."""
        return await self.db.read(
            q.first_request, key_hash, operation_key, kind, fingerprint, self.rules
        )

    async def submit_chat_request(
        self,
        *,
        key_hash: str,
        plan: AdmissionPlan,
        intake: q.Intake,
        now: float,
        upfront_max_length: int,
    ) -> q.Submitted | q.FirstRequest | Capacity:
        """The chat request admitted by ``plan`` against the online workers
        (its refusals raised) and queued, or the first request of its
        operation key; a Capacity, nothing written, when the pool is not the
        one the plan was worked out for."""
        return await self.db.write(
            q.submit_chat_request, key_hash, plan, intake, now, self.rules, upfront_max_length
        )

    async def cancel_request(
        self,
        *,
        request_id: str,
        kind: str,
        now: float,
        posted: dict[str, int],
        unread: bool = False,
        orphaned: bool = False,
    ) -> q.StatusSnapshot:
        """The request's status parts before its cancel, with what settling its
        streamed jobs on ``posted`` moved; raises RequestNotFound. ``unread``:
        nobody can read its reply, so a job settling later charges nothing;
        ``orphaned``: its reader's process is gone, so its streamed jobs
        charge nothing either."""
        return await self.db.write(
            q.cancel_request,
            request_id,
            kind,
            now,
            self.rules,
            posted,
            self.billions,
            unread,
            orphaned,
        )

    async def stored_response(self, *, request_id: str) -> dict[str, Any] | None:
        """A stored Response's record (None: none)."""
        return await self.db.read(q.stored_response, request_id)

    async def forget_response(self, *, request_id: str) -> None:
        """Drop a stored Response's record."""
        await self.db.write(q.forget_response, request_id)

    async def submitted_text(self, *, key_hash: str, request_id: str) -> SubmittedText:
        """The text request as queued, for its requester (or an admin);
        raises InvalidAPIKey, RequestNotFound, WrongCredentials."""
        return await self.db.read(submitted_text, key_hash, request_id, self.rules)

    async def hold_reader(self, *, reader: str, expires: float) -> None:
        """Renew the reader lease of this process's OpenAI calls."""
        await self.db.write(q.hold_reader, reader, expires)

    async def take_over_reader(self, *, reader: str, expires: float) -> list[tuple[str, str]]:
        """Hold ``reader``'s lease at a process's start; the waiting requests
        (id, kind) of the calls its predecessor under that name left."""
        return await self.db.write(q.take_over, reader, expires)

    async def lapsed_reader_requests(self, *, now: float, alive: str) -> list[tuple[str, str]]:
        """The waiting requests (id, kind) of the readers whose lease lapsed, but for
        ``alive`` (the process asking, which serves its calls)."""
        return await self.db.write(q.lapsed_requests, now, alive)

    async def request_status(
        self,
        *,
        request_id: str,
        kind: str,
        now: float,
        with_position: bool,
        with_free_threads: bool,
        online: list[WorkerView],
    ) -> q.StatusSnapshot:
        """The parts of the request's status answer; raises RequestNotFound."""
        return await self.db.read(
            q.request_status,
            request_id,
            kind,
            now,
            self.rules,
            with_position,
            with_free_threads,
            online,
        )

    # Workers and jobs ----------------------------------------------------

    async def pop_job(
        self,
        *,
        key_hash: str,
        pop: PopRequest,
        now: float,
        poll_left: float | None,
        address: str | None = None,
    ) -> q.PopResult:
        """The worker checked in and the job it was handed (or none); raises
        InvalidAPIKey, AnonForbiddenWorker and the pop's refusals.
        ``address``: where the pop came from, kept on the worker."""
        return await self.db.write(
            q.pop_job, key_hash, pop, now, self.rules, None, poll_left, address
        )

    async def skipped_sample(self) -> list[RequestView]:
        """The best waiting requests, the sample an empty pop counts ``skipped`` over."""
        return await self.db.read(q.skipped_sample)

    async def online_pool(self, *, now: float) -> list[q.OnlineWorker]:
        """Every worker online now, with the end of its check-in."""
        return await self.db.read(q.online_pool, now)

    async def chat_job_to_judge(
        self, *, key_hash: str, job_id: str
    ) -> tuple[str, dict[str, Any]] | None:
        """The model and stored chat request of the key's chat job in progress, or None."""
        return await self.db.read(q.chat_job_to_judge, key_hash, job_id)

    async def submit_job(
        self,
        *,
        key_hash: str,
        sub: JobSubmit | ChatSubmit,
        now: float,
        lease_until: float | None,
        verdict: Verdict | None,
    ) -> SubmitResult:
        """What storing the worker's answer to its job did (a refusal it must
        raise is in ``refusal``); raises InvalidAPIKey and the submit refusals."""
        return await self.db.write(
            q.submit_job, key_hash, sub, now, self.rules, self.billions, lease_until, verdict
        )

    async def record_refusal(self, *, key_hash: str, job_id: str, refusal: HordeError) -> None:
        """Record a malformed reply's refusal on the key's chat job (nothing when it is not one)."""
        await self.db.write(q.record_refusal, key_hash, job_id, refusal)

    async def sweep(self, *, now: float, extended: dict[str, float], wait: bool) -> q.SweepResult:
        """What one pass of the timers expired, ended and purged (``skipped`` when
        another process was sweeping and ``wait`` is False)."""
        return await self.db.write(q.sweep, now, self.rules, extended, wait=wait)

    async def served_models(self, *, now: float, limit: int, offset: int) -> q.ServedModels:
        """A page of the models served now (most threads first) with their
        queues, and how many are served. The database sums the whole pool:
        read off the event loop (``Database.read_aside``)."""
        return await self.db.read_aside(q.served_models, now, limit, offset)

    async def served_model(self, *, now: float, name: str) -> q.ServedModel | None:
        """The model ``name`` as ``served_models`` counts it, None when no
        online worker out of maintenance serves it (read off the event loop)."""
        found = await self.db.read_aside(q.served_models, now, 1, 0, name)
        return found.models[0] if found.models else None

    async def horde_load(self, *, now: float, since: float) -> HordeLoad:
        """The queue and the pool summed, and the tokens done since ``since``
        (an aggregate of the whole queue: read off the event loop)."""
        return await self.db.read_aside(horde_load, now, since)

    async def text_stats(self, *, now: float) -> TextStats:
        """Jobs done per period and model (an aggregate of every stored job:
        read off the event loop)."""
        return await self.db.read_aside(text_stats, now)

    async def queue_depth(self, *, now: float, top: int) -> q.QueueDepth:
        """Jobs waiting: for the ``top`` served models with most, the other
        served ones summed, any model, and the unserved. An aggregate of the
        whole queue: read off the event loop (``Database.read_aside``)."""
        return await self.db.read_aside(q.queue_depth, now, top)

    async def activity(self, *, start: float, bucket_seconds: int, count: int) -> list[Bucket]:
        """The buckets from ``start`` that saw a job done (empty ones left out)."""
        return await self.db.read(done_jobs_per_bucket, start, bucket_seconds, count)

    async def worker_details(
        self, *, worker_id: str | None = None, name_key: str | None = None
    ) -> q.WorkerRecord | None:
        """The worker with this id (or name key), None when there is none."""
        return await self.db.read(q.worker_details, worker_id, name_key)

    async def worker_page(
        self, *, now: float, limit: int, offset: int, busiest: bool = False
    ) -> q.WorkerPage:
        """Some of the workers online now (by name, or with ``busiest`` most
        jobs done first) and how many are online."""
        return await self.db.read(q.worker_page, now, limit, offset, busiest)

    async def update_worker(
        self,
        *,
        key_hash: str,
        worker_id: str,
        edit: WorkerEdit,
        now: float,
        address: str | None = None,
    ) -> q.WorkerChanges:
        """What the owner's (or an admin's) update changed; raises InvalidAPIKey,
        WorkerNotFound, WrongCredentials for another user's worker,
        NotModerator for a pause or a suspicion reset by a non-admin,
        NameAlreadyExists. An admin's moderation is in the audit trail,
        from ``address``."""
        return await self.db.write(
            q.update_worker, key_hash, worker_id, edit, self.rules, now, address
        )

    async def delete_worker(
        self, *, key_hash: str, worker_id: str, now: float, address: str | None = None
    ) -> q.DeletedWorker:
        """Delete the owner's (or, for an admin, any) worker, its jobs in hand
        given back; raises InvalidAPIKey, WorkerNotFound, WrongCredentials.
        An admin's delete of another's worker is in the audit trail."""
        return await self.db.write(q.delete_worker, key_hash, worker_id, self.rules, now, address)

    async def send_message(
        self, *, key_hash: str, new: NewMessage, now: float, address: str | None = None
    ) -> MessageRecord:
        """An admin's message to a worker; raises NotModerator, WorkerNotFound.
        In the audit trail, from ``address``."""
        return await self.db.write(messages.send_message, key_hash, new, self.rules, now, address)

    async def list_messages(
        self,
        *,
        key_hash: str,
        query: MessageQuery,
        now: float,
    ) -> list[MessageRecord]:
        """The page ``query`` asks for of the messages the key's user may
        read, newest first; raises InvalidAPIKey, WorkerNotFound,
        WrongCredentials."""
        return await self.db.read(messages.list_messages, key_hash, self.rules, query, now)

    async def message(self, *, message_id: str) -> MessageRecord | None:
        """The message with this id, None when there is none."""
        return await self.db.read(messages.message_by_id, message_id)

    async def delete_message(
        self, *, key_hash: str, message_id: str, now: float, address: str | None = None
    ) -> bool:
        """Whether an admin's delete found the message; raises NotModerator.
        A delete that found one is in the audit trail, from ``address``."""
        return await self.db.write(
            messages.delete_message, key_hash, message_id, self.rules, now, address
        )

    async def active_messages(self, *, now: float, limit: int) -> list[MessageRecord]:
        """The messages not yet expired at ``now``, newest first, at most ``limit``."""
        return await self.db.read(messages.active_messages, now, limit)

    async def modify_user(
        self,
        *,
        key_hash: str,
        user_id: int,
        edit: UserEdit,
        now: float,
        address: str | None = None,
    ) -> q.UserRecord:
        """The user as an admin's (or its own) change left it; raises
        InvalidAPIKey, UserNotFound, NotModerator, AnonForbiddenUserMod. An
        admin's change is in the audit trail, from ``address``."""
        return await self.db.write(modify_user, key_hash, user_id, edit, self.rules, now, address)

    async def create_shared_key(
        self, *, owner_hash: str, key_hash: str, nonce: str, terms: SharedKeyTerms, now: float
    ) -> SharedKeyRecord:
        """A new shared key of the owner's; raises InvalidAPIKey, AnonForbidden,
        Forbidden (too many)."""
        return await self.db.write(
            shared_keys.create_shared_key, owner_hash, key_hash, nonce, terms, self.rules, now
        )

    async def lent_keys(self, *, user_id: int) -> list[tuple[str, str]]:
        """The user's shared keys whose ids can be derived: (hash, nonce) each."""
        return await self.db.read(shared_keys.lent_keys, user_id)

    async def shared_key(self, *, key_hash: str) -> SharedKeyRecord:
        """A shared key's details; raises InvalidAPIKey when there is none."""
        return await self.db.read(shared_keys.shared_key, key_hash)

    async def edit_shared_key(
        self, *, owner_hash: str, key_hash: str, edit: SharedKeyEdit, now: float
    ) -> SharedKeyRecord:
        """The key as its owner's edit left it; raises InvalidAPIKey, WrongCredentials."""
        return await self.db.write(
            shared_keys.edit_shared_key, owner_hash, key_hash, edit, self.rules, now
        )

    async def delete_shared_key(self, *, owner_hash: str, key_hash: str) -> None:
        """Delete the owner's key; raises InvalidAPIKey, WrongCredentials."""
        await self.db.write(shared_keys.delete_shared_key, owner_hash, key_hash, self.rules)

    async def webhooks_due(self, *, now: float) -> bool:
        """Whether a webhook call is owed and due at ``now`` (a read)."""
        return await self.db.read(webhooks.any_due, now)

    async def claim_webhooks(
        self, *, now: float, limit: int, busy: Mapping[webhooks.Requester, int], per_user: int
    ) -> list[OwedCall]:
        """Claim at most ``limit`` of the webhook calls due at ``now``, at
        most ``per_user`` less ``busy[user]`` for each requester (another
        process's claims are skipped, not waited for)."""
        return await self.db.write(webhooks.claim_calls, now, limit, busy, per_user)

    async def settle_webhook(self, *, call: OwedCall, done: bool, now: float) -> float | None:
        """Record a claimed call's outcome; when it is due again, or None."""
        return await self.db.write(webhooks.settle_call, call, done=done, now=now)

    # The operator's (synchronous) ----------------------------------------

    def list_users(self) -> list[q.UserRecord]:
        """Every user, by id."""
        return self.db.run_sync(admin.list_users, False)

    def find_user(self, *, user_id: int) -> q.UserRecord | None:
        """The user with this id, None when there is none."""
        try:
            return self.db.run_sync(q.user_by_id, False, user_id)
        except HordeError as refusal:
            if refusal.rc is RC.UserNotFound:
                return None
            raise

    def users_named(self, *, name: str) -> list[q.UserRecord]:
        """The users with this name, compared case-insensitively."""
        return self.db.run_sync(admin.users_named, False, name)

    def create_named_user(
        self,
        *,
        username: str,
        key_hash: str,
        kudos: float,
        admin: bool,
        trusted: bool,
        now: float,
        actor: audit.Actor = audit.CLI_ACTOR,
    ) -> q.UserRecord | list[q.UserRecord]:
        """The new user, or the users already so named (nothing created);
        its creation is in the audit trail as ``actor``'s."""
        return self.db.run_sync(
            _create_named_user, True, username, key_hash, kudos, admin, trusted, now, actor
        )

    def set_key(
        self,
        *,
        user_id: int,
        key_hash: str | None,
        now: float,
        actor: audit.Actor = audit.CLI_ACTOR,
    ) -> int:
        """Store the user's new key hash, or revoke its key (None); the
        shared keys it lent go too: how many. In the audit trail as
        ``actor``'s."""
        return self.db.run_sync(admin.set_key, True, user_id, key_hash, actor, now)

    def grant_kudos(
        self, *, user_id: int, amount: float, now: float, actor: audit.Actor = audit.CLI_ACTOR
    ) -> tuple[float, float]:
        """The user's balance before and after adding ``amount`` (may be
        negative); in the audit trail as ``actor``'s."""
        return self.db.run_sync(admin.grant_kudos, True, user_id, amount, actor, now)

    def list_all_workers(self) -> list[q.WorkerRecord]:
        """Every worker the horde knows, online or not, by name."""
        return self.db.run_sync(q.list_workers, False, None)


# The parameter ``admin`` of create_named_user shadows the module there.
_create_named_user = admin.create_named_user
