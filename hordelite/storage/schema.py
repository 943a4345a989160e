"""The one schema, in SQLAlchemy Core, for SQLite and PostgreSQL.

Times are float seconds since the epoch (the injectable clock's unit).

The queue is its own table: one row per (waiting request, acceptable model),
present only while the request still has jobs to hand out. A pop walks the
index ``ix_queue_order`` of each model the worker serves, in priority order,
so requests for other models are never read, and the walk stops at the first
row the worker can take.
"""

from __future__ import annotations

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

from hordelite.contract.limits import (
    MAX_AGENT_CHARS,
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_NAME,
    MAX_NAME_KEY,
    MAX_READER_CHARS,
    MAX_WEBHOOK_CHARS,
    MAX_WORKER_INFO,
)

metadata = MetaData()

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
    # sha256 of the key: keys are 16 random bytes (22 characters), so a fast hash
    # cannot be brute-forced and keeps authentication cheap per request.
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("anonymous", Boolean, nullable=False, default=False),
    Column("admin", Boolean, nullable=False, default=False),
    Column("trusted", Boolean, nullable=False, default=False),
    Column("kudos", Float, nullable=False, default=0.0),
    Column("kudos_earned", Float, nullable=False, default=0.0),
    Column("kudos_spent", Float, nullable=False, default=0.0),
    # Kudos sent to and received from other users (POST /kudos/transfer).
    Column("kudos_gifted", Float, nullable=False, default=0.0, server_default="0"),
    Column("kudos_received", Float, nullable=False, default=0.0, server_default="0"),
    # null: the horde's default concurrency
    Column("concurrency", Integer, nullable=True),
    # Bytes of generations its requests keep until their purge (decision
    # 0069): the sum of their generation_bytes, counted in its stored bytes.
    Column("generation_bytes", BigInteger, nullable=False, default=0, server_default="0"),
    Column("created", Float, nullable=False),
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
    Column("kudos_rewards", Float, nullable=False, default=0.0),
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
    Index("ux_workers_name_key", "name_key", unique=True),
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
    Column("kudos", Float, nullable=False, default=0.0),
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
    # Queued through a shared key (its hash): its jobs spend the key's kudos.
    Column("shared_key", String(64), nullable=True),
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
    Index("ix_requests_state_expires", "state", "expires"),
    Index("ix_requests_order", "state", "anonymous", text("prio_key DESC")),
    Index("ix_requests_user_state", "user_id", "state"),
    Index("ix_requests_ended", "ended"),
    # A user's requests queued in the last minute (requests_per_minute).
    Index("ix_requests_user_created", "user_id", "created"),
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
    Column("reward", Float, nullable=True),
    Column("cost", Float, nullable=True),
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
    Column("name", String(MAX_NAME), nullable=False, default=""),
    Column("kudos", Float, nullable=False),
    Column("utilized", Float, nullable=False, default=0.0),
    Column("expiry", Float, nullable=True),
    Column("max_text_tokens", BigInteger, nullable=False),
    Column("max_image_pixels", BigInteger, nullable=False),
    Column("max_image_steps", BigInteger, nullable=False),
    Column("created", Float, nullable=False),
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
