"""The one schema, in SQLAlchemy Core, for SQLite and PostgreSQL.

Times are float seconds since the epoch (the injectable clock's unit).
Kudos are whole thousandths, stored as integers (``Kudos``, decision 0072).

The queue is its own table: one row per (waiting request, acceptable model),
present only while the request still has jobs to hand out. A pop walks the
index ``ix_queue_order`` of each model the worker serves, in priority order,
so requests for other models are never read, and the walk stops at the first
row the worker can take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg.types.numeric import Int8
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
    text,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.operators import OperatorType, add, sub
from sqlalchemy.types import TypeDecorator, TypeEngine

from hordelite.contract.limits import (
    MAX_AGENT_CHARS,
    MAX_CLIENT_KEY_CHARS,
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_NAME,
    MAX_NAME_KEY,
    MAX_READER_CHARS,
    MAX_WEBHOOK_CHARS,
    MAX_WORKER_INFO,
)

metadata = MetaData()

# The prefix of the name key of a worker or user a migration found sharing
# its name's key with an older one (decisions 0029 and 0073): followed by its
# id, a key no name folds to (names refuse control characters), so no pop or
# rename can reach it.
RETIRED_NAME_KEY = "\x1f"
# Kudos per stored unit: a column of kudos holds whole thousandths.
KUDOS_SCALE = 1000


class Kudos(TypeDecorator[float]):
    """An amount of kudos, stored as an integer of thousandths (decision
    0072): Python sees the float nearest to each thousandth (as JSON shows
    it), the database only integers, so that ``kudos - :amount``,
    ``kudos >= :price`` and ``SUM(kudos)`` are exact. A value bound is
    rounded to the thousandth.

    A database migrated from floats on SQLite keeps its columns' REAL
    affinity: they hold integral doubles there, exact below 2**53
    thousandths (9e12 kudos), read back the same.
    """

    impl = BigInteger
    cache_ok = True

    def coerce_compared_value(self, op: OperatorType | None, value: Any) -> TypeEngine[Any]:
        # Kudos compared with, added to or taken from kudos are kudos; a
        # factor (kudos * 2) or a divisor is a plain number.
        if op in (add, sub) or getattr(op, "__name__", None) in _COMPARISONS:
            return self
        return Float()

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any]:
        if dialect.name == "postgresql":
            return _to_int8_thousandths
        return _to_thousandths

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any]:
        return _from_thousandths


# (between binds its bounds under and_.)
_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "and_", "in_op", "not_in_op"})


def _to_thousandths(value: float | None) -> int | None:
    return None if value is None else round(value * KUDOS_SCALE)


def _to_int8_thousandths(value: float | None) -> int | None:
    # Always sent as int8: psycopg otherwise picks int2, int4 or int8 by
    # each value's size, one more step per value, and each mix of them is
    # a statement prepared anew on the connection.
    return None if value is None else Int8(round(value * KUDOS_SCALE))


def _from_thousandths(value: float | None) -> float | None:
    # int / int is correctly rounded: the float nearest to the thousandth,
    # the same float the amount's decimal text parses to.
    return None if value is None else value / KUDOS_SCALE


schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, nullable=False),
)

users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("username", String(100), nullable=False),
    # What names are compared by (unicode_rules.fold_name, as for workers):
    # no two users have one (decision 0073). Set on every insert; nullable
    # only because a migration added it to tables that had rows.
    Column("name_key", String(MAX_NAME_KEY), nullable=True),
    # sha256 of the key: keys are 16 random bytes (22 characters), so a fast hash
    # cannot be brute-forced and keeps authentication cheap per request.
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("anonymous", Boolean, nullable=False, default=False),
    Column("admin", Boolean, nullable=False, default=False),
    Column("trusted", Boolean, nullable=False, default=False),
    Column("kudos", Kudos, nullable=False, default=0.0),
    Column("kudos_earned", Kudos, nullable=False, default=0.0),
    Column("kudos_spent", Kudos, nullable=False, default=0.0),
    # Kudos sent to and received from other users (POST /kudos/transfer).
    Column("kudos_gifted", Kudos, nullable=False, default=0.0, server_default="0"),
    Column("kudos_received", Kudos, nullable=False, default=0.0, server_default="0"),
    # null: the horde's default concurrency
    Column("concurrency", Integer, nullable=True),
    # Bytes of generations its requests keep until their purge (decision
    # 0069): the sum of their generation_bytes, counted in its stored bytes.
    Column("generation_bytes", BigInteger, nullable=False, default=0, server_default="0"),
    Column("created", Float, nullable=False),
    Index("ux_users_name_key", "name_key", unique=True),
)

workers = Table(
    "workers",
    metadata,
    Column("id", String(36), primary_key=True),
    # The name as first popped with, shown everywhere.
    Column("name", String(MAX_NAME), nullable=False, unique=True),
    # What names are compared by (hordelite.contract.unicode_rules.worker_name_key):
    # names that differ only in case or look-alike characters are one worker.
    # Set on every insert; nullable only because migration 4 added it to
    # tables that had rows (it fills them in).
    Column("name_key", String(MAX_NAME_KEY), nullable=True),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False, index=True),
    Column("bridge_agent", String(MAX_AGENT_CHARS), nullable=False, default=""),
    Column("models", JSON, nullable=False),
    Column("max_length", Integer, nullable=False),
    Column("max_context_length", Integer, nullable=False),
    Column("nsfw", Boolean, nullable=False, default=True),
    Column("threads", Integer, nullable=False, default=1),
    Column("extra_slow", Boolean, nullable=False, default=False),
    Column("created", Float, nullable=False),
    Column("last_check_in", Float, nullable=False, index=True),
    Column("uptime", Float, nullable=False, default=0.0),
    Column("maintenance", Boolean, nullable=False, default=False),
    Column("kudos_rewards", Kudos, nullable=False, default=0.0),
    Column("requests_fulfilled", Integer, nullable=False, default=0),
    Column("uncompleted_jobs", Integer, nullable=False, default=0),
    # Aborted jobs are counted in fixed windows of an hour.
    Column("abort_window_start", Float, nullable=False, default=0.0),
    Column("aborts_in_window", Integer, nullable=False, default=0),
    # Measured speed: billed tokens over seconds from pop to submit.
    Column("tokens_generated", Float, nullable=False, default=0.0),
    Column("seconds_generating", Float, nullable=False, default=0.0),
    # The chat declaration of the last pop (null: no chat jobs).
    Column("chat", JSON, nullable=True),
    Column("chat_model", String(MAX_NAME), nullable=True, index=True),
    Column("prompt_jobs", Boolean, nullable=False, default=True, server_default=true()),
    Column("nonconformant_replies", Integer, nullable=False, default=0, server_default="0"),
    # Until when the worker counts as online (hordelite.contract.presence):
    # set by every pop, lowered to the moment it says it stops.
    Column("online_until", Float, nullable=False, default=0.0, server_default="0", index=True),
    # The owner's description (PUT info), shown in the worker's details.
    Column("info", String(MAX_WORKER_INFO), nullable=True),
    # An admin's pause: the worker keeps checking in and gets no job.
    Column("paused", Boolean, nullable=False, default=False, server_default=false()),
    # Deleted by its owner (DELETE /workers/{id}): kept for the jobs that
    # name it, its name and key retired so that the name can be popped anew.
    Column("deleted", Boolean, nullable=False, default=False, server_default=false()),
    # Its suspicion (hordelite.contract.suspicion): the count, paused at the
    # threshold, and the bitmask of the reasons that count once (1 << code).
    Column("suspicion", Integer, nullable=False, default=0, server_default="0"),
    Column("suspicion_reasons", Integer, nullable=False, default=0, server_default="0"),
    # The address its last pop came from (an IPv4 address or an IPv6 /64, as
    # contract.forwarded gives it), which a moderator may block
    # (/operations/block_worker_ipaddr); null before its first pop since.
    Column("address", String(MAX_CLIENT_KEY_CHARS), nullable=True),
    Index("ux_workers_name_key", "name_key", unique=True),
)

# An admin's pause or a maintenance that a deleted worker had, kept for its
# owner's worker name (by key) so that popping anew under that name does not
# lift it: the next worker its owner registers under the name takes it, and
# the row goes (decision 0073).
worker_holds = Table(
    "worker_holds",
    metadata,
    Column("user_id", Integer, ForeignKey("users.id"), primary_key=True),
    Column("name_key", String(MAX_NAME_KEY), primary_key=True),
    Column("paused", Boolean, nullable=False),
    Column("maintenance", Boolean, nullable=False),
)

requests = Table(
    "requests",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("kind", String(8), nullable=False, default="text"),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False),
    # waiting (in the queue or in progress), done, faulted, cancelled, expired
    Column("state", String(12), nullable=False),
    Column("prompt", Text, nullable=False),
    Column("params", JSON, nullable=False),
    Column("models", JSON, nullable=False),
    Column("worker_ids", JSON, nullable=False),
    Column("worker_blacklist", Boolean, nullable=False, default=False),
    Column("trusted_workers", Boolean, nullable=False, default=False),
    Column("slow_workers", Boolean, nullable=False, default=True),
    Column("nsfw", Boolean, nullable=False, default=False),
    Column("softprompt", String(MAX_NAME), nullable=True),
    Column("n", Integer, nullable=False),
    # Jobs not yet handed to a worker.
    Column("remaining", Integer, nullable=False),
    Column("max_length", Integer, nullable=False),
    Column("max_context_length", Integer, nullable=False),
    Column("anonymous", Boolean, nullable=False),
    Column("priority", Float, nullable=False),
    Column("prio_key", Float, nullable=False),
    Column("kudos", Kudos, nullable=False, default=0.0),
    Column("finished", Integer, nullable=False, default=0),
    Column("faults", Integer, nullable=False, default=0),
    Column("restarts", Integer, nullable=False, default=0),
    Column("created", Float, nullable=False),
    Column("expires", Float, nullable=False),
    Column("ended", Float, nullable=True),
    Column("client_agent", String(MAX_AGENT_CHARS), nullable=False, default=""),
    Column("proxied_account", String(MAX_NAME), nullable=True),
    Column("webhook", String(MAX_WEBHOOK_CHARS), nullable=True),
    # Its webhook's call is owed from here on (decision 0056): set to the end
    # when a request with a webhook ends, moved on by each claim and
    # failure's back-off, null once called or given up (or with no webhook).
    Column("hook_due", Float, nullable=True),
    Column("hook_tries", Integer, nullable=False, default=0, server_default="0"),
    # Queued through a shared key (its hash): its jobs spend the key's kudos,
    # and each job not yet settled holds ``shared_price`` kudos reserved on
    # the key (contract.shared_keys; null: queued before reservations, or
    # not through a shared key).
    Column("shared_key", String(64), nullable=True),
    Column("shared_price", Kudos, nullable=True),
    # Chat requests: the validated request (its kept messages included), the
    # full flattened submission (``prompt`` holds the kept conversation
    # flattened), what a worker must declare, and the sizes routing reads.
    Column("chat", JSON, nullable=True),
    Column("submitted_prompt", Text, nullable=True),
    Column("features", Integer, nullable=False, default=0, server_default="0"),
    Column("context_tokens", Integer, nullable=False, default=0, server_default="0"),
    Column("tools_temperature", Float, nullable=True),
    Column("context_adjustments", JSON, nullable=True),
    # Why the request faulted, as the client is told.
    Column("fault_rc", String(64), nullable=True),
    Column("fault_message", Text, nullable=True),
    # A resubmit with the same Idempotency-Key returns this request.
    Column("operation_key", String(MAX_IDEMPOTENCY_KEY_CHARS), nullable=True),
    Column("fingerprint", String(64), nullable=True),
    # What the request holds stored, for its user's budgets (decision 0049):
    # bytes of prompt and conversation (at least 1 while held; 0 once its
    # content is released after it ended and its jobs came back), and of
    # its stored images.
    Column("held_bytes", BigInteger, nullable=False, default=0, server_default="0"),
    Column("image_bytes", BigInteger, nullable=False, default=0, server_default="0"),
    # Bytes of the generations its jobs stored (decision 0069): counted in
    # its user's generation_bytes until the purge deletes them.
    Column("generation_bytes", BigInteger, nullable=False, default=0, server_default="0"),
    # An OpenAI call's request: the serving process holding the call, its
    # only reader (a row of ``readers``); null for the native API, whose
    # status anyone with the id may read (decision 0051).
    Column("reader", String(MAX_READER_CHARS), nullable=True),
    # Its reader is gone (the call ended without its answer, or the process
    # holding it died): a reply that settles from here on charges nothing.
    Column("unread", Boolean, nullable=False, default=False, server_default=false()),
    # An anonymous request's client, as its budgets count it (decision 0071):
    # the address, or the IPv6 /64, it came from ("" when none is known);
    # null for a registered user's, whose budgets are its own.
    Column("client", String(MAX_CLIENT_KEY_CHARS), nullable=True),
    # A stored OpenAI Response (decision 0078): what answers GET
    # /v1/responses/{id} and continues it by previous_response_id (its echo,
    # its conversation, its requester's key hash), kept until the purge and
    # counted in generation_bytes meanwhile; null for any other request, a
    # Response sent with store: false, and one deleted.
    Column("response", JSON, nullable=True),
    Index("ix_requests_state_expires", "state", "expires"),
    Index("ix_requests_order", "state", "anonymous", text("prio_key DESC")),
    Index("ix_requests_user_state", "user_id", "state"),
    Index("ix_requests_ended", "ended"),
    # A user's requests queued in the last minute (requests_per_minute).
    Index("ix_requests_user_created", "user_id", "created"),
    # The same two for an anonymous client's requests; partial, so a
    # registered user's request adds no entry to them.
    Index(
        "ix_requests_client_created",
        "client",
        "created",
        sqlite_where=text("client IS NOT NULL"),
        postgresql_where=text("client IS NOT NULL"),
    ),
    Index(
        "ix_requests_held_client",
        "client",
        "held_bytes",
        sqlite_where=text("held_bytes > 0 AND client IS NOT NULL"),
        postgresql_where=text("held_bytes > 0 AND client IS NOT NULL"),
    ),
    # Only the requests still holding content: a user's (the budgets), and
    # the ended ones the sweep releases. Partial, so each is as small as what
    # is held, not as the retention's history.
    Index(
        "ix_requests_held_user",
        "user_id",
        # Also the condition's column: SQLite then prefers this index to
        # ix_requests_user_created (two terms of the query against one).
        "held_bytes",
        sqlite_where=text("held_bytes > 0"),
        postgresql_where=text("held_bytes > 0"),
    ),
    Index(
        "ix_requests_held_ended",
        "ended",
        sqlite_where=text("held_bytes > 0"),
        postgresql_where=text("held_bytes > 0"),
    ),
    # The webhook calls owed: partial, so as small as the calls not yet made.
    Index(
        "ix_requests_hook_due",
        "hook_due",
        sqlite_where=text("hook_due IS NOT NULL"),
        postgresql_where=text("hook_due IS NOT NULL"),
    ),
    # A shared key's requests (what they hold reserved): partial, so the
    # requests sent with users' own keys are not in it.
    Index(
        "ix_requests_shared_key",
        "shared_key",
        "state",
        sqlite_where=text("shared_key IS NOT NULL"),
        postgresql_where=text("shared_key IS NOT NULL"),
    ),
    # NULL keys are distinct, so only requests with a key are constrained.
    Index("ix_requests_operation", "user_id", "operation_key", unique=True),
    # The waiting requests of an OpenAI call's reader: what is cancelled when
    # the process holding the calls is gone. Partial: native requests, and
    # ended ones, are not in it.
    Index(
        "ix_requests_reader",
        "reader",
        sqlite_where=text("reader IS NOT NULL AND state = 'waiting'"),
        postgresql_where=text("reader IS NOT NULL AND state = 'waiting'"),
    ),
)

# The serving processes holding OpenAI calls, each with the end of its
# reader lease (contract.limits.READER_LEASE_SECONDS). A reader is named by
# host, port and process slot, so a process restarted in its place knows
# the requests of the calls its predecessor held.
readers = Table(
    "readers",
    metadata,
    Column("id", String(MAX_READER_CHARS), primary_key=True),
    Column("expires", Float, nullable=False),
)

# A queue row's model when its request names none: any worker's model serves it.
ANY_MODEL = ""

queue = Table(
    "queue",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("request_id", String(36), ForeignKey("requests.id"), nullable=False, index=True),
    # "" means the request accepts any model.
    Column("model", String(MAX_NAME), nullable=False),
    Column("user_id", Integer, nullable=False),
    Column("anonymous", Boolean, nullable=False),
    Column("prio_key", Float, nullable=False),
    Column("created", Float, nullable=False),
    Column("max_length", Integer, nullable=False),
    Column("max_context_length", Integer, nullable=False),
    Column("trusted_only", Boolean, nullable=False),
    Column("fast_only", Boolean, nullable=False),
    Column("nsfw", Boolean, nullable=False),
    # 0: any worker; 1: only the listed workers; 2: any but the listed ones.
    Column("worker_filter", Integer, nullable=False),
    # text or chat; a chat row also carries what its worker must declare.
    Column("kind", String(8), nullable=False, default="text", server_default="text"),
    Column("features", Integer, nullable=False, default=0, server_default="0"),
    Column("context_tokens", Integer, nullable=False, default=0, server_default="0"),
    Column("tools_temperature", Float, nullable=True),
    # A worker's owner's own requests are looked up apart, first.
    Index("ix_queue_user", "user_id", "model"),
)
# One walk per (model, kind, required features) class, in the pop's order
# (prio_key descending), so that the walk reads rows in order and stops at
# the first it can take: no sort, and classes a worker's declaration does not
# cover are never read.
Index(
    "ix_queue_order",
    queue.c.model,
    queue.c.kind,
    queue.c.features,
    queue.c.anonymous,
    queue.c.prio_key.desc(),
    queue.c.created,
)

# The (model, kind, features) classes that have, or recently had, queue rows:
# a chat pop reads the few classes its declaration covers here, then walks
# each one's index range. The sweep removes classes left empty.
queue_classes = Table(
    "queue_classes",
    metadata,
    Column("model", String(MAX_NAME), primary_key=True),
    Column("kind", String(8), primary_key=True),
    Column("features", Integer, primary_key=True),
    # Refreshed by submits at most once a minute; the sweep forgets a class
    # only when it has been idle an hour and has no rows, so a submit and
    # the sweep never race over a class in use.
    Column("last_used", Float, nullable=False, default=0.0, server_default="0"),
)

request_workers = Table(
    "request_workers",
    metadata,
    Column("request_id", String(36), ForeignKey("requests.id"), primary_key=True),
    Column("worker_id", String(36), primary_key=True),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("request_id", String(36), ForeignKey("requests.id"), nullable=False, index=True),
    Column("worker_id", String(36), ForeignKey("workers.id"), nullable=False, index=True),
    Column("owner_id", Integer, nullable=False),
    Column("model", String(MAX_NAME), nullable=False),
    # processing, done, faulted, expired, cancelled
    Column("state", String(12), nullable=False),
    Column("started", Float, nullable=False),
    Column("lease_expires", Float, nullable=False),
    Column("submitted", Float, nullable=True),
    Column("text", Text, nullable=True),
    Column("gen_state", String(12), nullable=True),
    Column("seed", BigInteger, nullable=True),
    Column("gen_metadata", JSON, nullable=True),
    Column("tokens", Integer, nullable=True),
    Column("reward", Kudos, nullable=True),
    Column("cost", Kudos, nullable=True),
    # Chat jobs: the budgets assigned at pop, the verified reply, and the
    # last refusal of a reply (its code decides how a later fault counts).
    Column("kind", String(8), nullable=False, default="text", server_default="text"),
    Column("max_length", Integer, nullable=True),
    Column("max_context_length", Integer, nullable=True),
    Column("reply", JSON, nullable=True),
    Column("refusal_rc", String(64), nullable=True),
    Column("refusal_message", Text, nullable=True),
    Column("fault_reason", String(64), nullable=True),
    Column("charge_basis", String(32), nullable=True),
    Index("ix_jobs_state_lease", "state", "lease_expires"),
)

# /stats/text: the jobs done per UTC day and model, of the jobs no longer
# stored (the purge adds its done jobs here in its transaction, as it does
# for activity_minutes), kept for ever: a row per model served each day.
stats_days = Table(
    "stats_days",
    metadata,
    # The day's start, seconds since the epoch (a multiple of 86400).
    Column("day", BigInteger, primary_key=True, autoincrement=False),
    Column("model", String(MAX_NAME), primary_key=True),
    Column("jobs", Integer, nullable=False),
    Column("tokens", BigInteger, nullable=False),
)

# Messages to workers (POST /workers/messages, an admin's), shown to the
# worker's owner and carried by its pops until they expire; the sweep
# deletes them a retention after that.
worker_messages = Table(
    "worker_messages",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("worker_id", String(36), ForeignKey("workers.id"), nullable=False, index=True),
    Column("message", Text, nullable=False),
    Column("origin", String(MAX_NAME), nullable=True),
    Column("created", Float, nullable=False),
    Column("expires", Float, nullable=False, index=True),
)

# Shared keys (decision 0058): keys a user lends, stored by their hash as
# users' keys are (decision 0009). kudos: what the key may still spend (-1
# unlimited), utilized: what it spent; expiry null: never; the limits -1:
# none.
shared_keys = Table(
    "shared_keys",
    metadata,
    Column("key_hash", String(64), primary_key=True),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False, index=True),
    # What its id was derived from, with the lender's key
    # (contract.shared_keys.key_id_of): the lender lists its keys with it.
    # Null: lent before ids were derived (its id cannot be listed).
    Column("id_nonce", String(32), nullable=True),
    Column("name", String(MAX_NAME), nullable=False, default=""),
    Column("kudos", Kudos, nullable=False),
    Column("utilized", Kudos, nullable=False, default=0.0),
    Column("expiry", Float, nullable=True),
    Column("max_text_tokens", BigInteger, nullable=False),
    Column("max_image_pixels", BigInteger, nullable=False),
    Column("max_image_steps", BigInteger, nullable=False),
    Column("created", Float, nullable=False),
)

# Budget refusals (decision 0071), each counted toward requests_per_minute
# as a request would be: the user's, or for the anonymous user its client's
# (as requests.client; "" for a registered user). A refusal of the rate
# itself is not one, so a flooder adds at most a minute's budget of rows;
# each sweep deletes those older than the window.
budget_refusals = Table(
    "budget_refusals",
    metadata,
    Column("user_id", Integer, nullable=False),
    Column("client", String(MAX_CLIENT_KEY_CHARS), nullable=False, default=""),
    Column("at", Float, nullable=False),
    Index("ix_budget_refusals_who", "user_id", "client", "at"),
    Index("ix_budget_refusals_at", "at"),
)

# The anonymous user's released generations, per client address (decisions
# 0069 and 0071): as users.generation_bytes, but the anonymous user's stored
# bytes are counted per address, so one address's generations fill only its
# own budget. Counted at release, taken off at the purge, which deletes a
# row whose count is back at 0: one short row per address whose released
# requests are not purged yet.
client_generations = Table(
    "client_generations",
    metadata,
    Column("client", String(MAX_CLIENT_KEY_CHARS), primary_key=True),
    Column("generation_bytes", BigInteger, nullable=False, default=0),
)

# Transfers sent with an Idempotency-Key (decision 0072): a retry under the
# same key answers the first transfer and moves nothing again. A transfer is
# the target and the amount (a key reused for another is 409); the sweep
# deletes keys a retention old, as it purges requests and their keys.
transfer_keys = Table(
    "transfer_keys",
    metadata,
    Column("user_id", Integer, ForeignKey("users.id"), primary_key=True),
    Column("operation_key", String(MAX_IDEMPOTENCY_KEY_CHARS), primary_key=True),
    Column("target_id", Integer, nullable=False),
    Column("amount", Kudos, nullable=False),
    Column("created", Float, nullable=False, index=True),
)

# The dashboard's activity of jobs no longer stored (decision 0044): when the
# sweep purges ended requests it first adds their done jobs here, one row per
# minute they were done in, in the same transaction, so a done job is counted
# either among the stored jobs or here, never both. Rows older than the
# dashboard's window go with each sweep: at most an hour's minutes are kept.
activity_minutes = Table(
    "activity_minutes",
    metadata,
    # The minute's start, seconds since the epoch (a multiple of 60).
    Column("minute", BigInteger, primary_key=True, autoincrement=False),
    Column("jobs", Integer, nullable=False),
    Column("tokens", BigInteger, nullable=False),
    # Seconds from each job's request submit to its own, summed.
    Column("latency_sum", Float, nullable=False),
)

# The audit trail (decision 0077): every moderator's action, through the
# routes or the CLI, and every request a filter refused or flagged. Who
# (``actor``: ``name#id`` of the admin, ``cli`` for the operator at the
# shell, ``horde`` for the horde's own countermeasures), from which address
# (the client's; "" at the shell), what (``action``, a name from
# hordelite.storage.audit.ACTIONS), on what (``target``: a user, a worker,
# a filter, an address) and the rest in ``detail``. The sweep deletes
# entries older than [moderation] audit_retention.
audit = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False, index=True),
    Column("actor", String(MAX_NAME), nullable=False),
    Column("actor_id", Integer, nullable=True),
    Column("address", String(MAX_CLIENT_KEY_CHARS), nullable=False, default=""),
    Column("action", String(64), nullable=False),
    Column("target", String(MAX_NAME), nullable=False, default=""),
    Column("detail", JSON, nullable=False),
    Index("ix_audit_action_at", "action", "at"),
)

# A moderator's notes on prompt events (``GET /operations/moderation/prompts``),
# each on a ``request.refused`` or ``request.flagged`` audit entry. No
# foreign key: the sweep purges old entries, and a note says what a
# moderator wrote even then; ``author_id`` outlives its account likewise.
prompt_notes = Table(
    "prompt_notes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", Integer, nullable=False, index=True),
    Column("author_id", Integer, nullable=True),
    Column("note", Text, nullable=False),
    Column("created", Float, nullable=False),
)

# The horde's modes (hordelite.contract.modes): one row, id 1, absent until
# they are first set (all off). ``version`` grows with every change: each
# process reads the row at most every MODES_SECONDS (hordelite.horde.modes).
horde_modes = Table(
    "horde_modes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("maintenance", Boolean, nullable=False, default=False),
    Column("invite_only", Boolean, nullable=False, default=False),
    Column("raid", Boolean, nullable=False, default=False),
    Column("version", Integer, nullable=False, default=0),
    Column("changed", Float, nullable=False),
)

# Timeouts and blocks by address (contract.addresses): one row per target in
# its canonical form (an IPv4 address, an IPv6 /64, a CIDR range). ``until``
# None is a block until lifted; a lapsed timeout is not in force (compared
# with the horde's clock) and the sweep deletes it. ``automatic``: set by
# the horde for repeated offences, which never shorten an operator's rule.
address_rules = Table(
    "address_rules",
    metadata,
    Column("target", String(MAX_CLIENT_KEY_CHARS), primary_key=True),
    Column("until", Float, nullable=True, index=True),
    Column("created", Float, nullable=False),
    Column("automatic", Boolean, nullable=False, default=False),
)

# The version of address_rules, one row bumped by every change to them: each
# process re-reads the rules only when it moved, looking at most every
# ADDRESS_RULES_SECONDS (one read by primary key), so that a change made on
# one replica is enforced by every other within seconds, with no Redis.
address_rules_version = Table(
    "address_rules_version",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", BigInteger, nullable=False),
)

# The offences of a client address (contract.addresses.after_offence): its
# count, the budget refusals toward the next, and when it last offended; a
# record older than [moderation] offence_memory is forgotten (the sweep
# deletes it).
address_offences = Table(
    "address_offences",
    metadata,
    Column("client", String(MAX_CLIENT_KEY_CHARS), primary_key=True),
    Column("offences", Integer, nullable=False),
    Column("refusals", Integer, nullable=False),
    Column("last", Float, nullable=False, index=True),
)

# Prompt filters (docs/reference/filters.md): an admin's rules, each a
# regex RE2 compiles, with the AI Horde's fields and hordelite's action.
# ``user_id``: the admin who wrote or last changed it (no foreign key: a
# filter outlives its author's account, as its audit entries do).
filters = Table(
    "filters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("regex", Text, nullable=False),
    Column("filter_type", Integer, nullable=False, index=True),
    Column("description", Text, nullable=True),
    Column("replacement", Text, nullable=False, default=""),
    Column("action", String(16), nullable=False, default="refuse"),
    Column("user_id", Integer, nullable=True),
    Column("author", String(MAX_NAME), nullable=False, default=""),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
)

# One row: the filters' revision, bumped in the transaction of every change
# to them, so that each process sees a change by reading this one number
# (hordelite.horde.moderation), never the rules on every request.
filter_revision = Table(
    "filter_revision",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("revision", BigInteger, nullable=False),
)
