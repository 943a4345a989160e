"""Every limit and constant of the specification, in one place.

Values an operator may want to change are configuration keys
(hordelite.config); these are the wire contract's fixed bounds, the
queue's arithmetic and the horde's fixed timings. Code imports each from
here: no bound is written as a literal where it is used. A module's own
tuning that no client or worker can observe (a retry count, a cache size)
stays a named constant of that module.
"""

from typing import Final

# Request bounds of the AI Horde text API.
MIN_MAX_LENGTH: Final = 16
MAX_MAX_LENGTH: Final = 4096
DEFAULT_MAX_LENGTH: Final = 80
MIN_CONTEXT_LENGTH: Final = 80
MAX_CONTEXT_LENGTH: Final = 1_048_576
DEFAULT_MAX_CONTEXT_LENGTH: Final = 2048
MAX_REQUEST_N: Final = 20
MAX_WORKER_IDS: Final = 5
MAX_MODELS: Final = 100
MAX_NAME: Final = 255
# Characters of a worker name's key (its NFKC case fold) at most: 255 at four
# UTF-8 bytes each keeps the unique index's entries under PostgreSQL's b-tree
# limit (about 2,700 bytes).
MAX_NAME_KEY: Final = 255
# An id a client sends (a UUID has 36 characters): a longer one is refused
# without being parsed.
MAX_ID_CHARS: Final = 64
# An API key (apikey header, Bearer token, worker.key) and an Idempotency-Key.
MAX_API_KEY_CHARS: Final = 255
MAX_IDEMPOTENCY_KEY_CHARS: Final = 255
# The X-Horde-Options header (the ``horde`` object of a client that cannot
# send a body field of its own): a JSON object of a few short options.
MAX_HORDE_OPTIONS_HEADER_CHARS: Final = 2048
# client_agent and bridge_agent, stored as given up to this length.
MAX_AGENT_CHARS: Final = 1000
MAX_WEBHOOK_CHARS: Final = 1024
MAX_PRIORITY_USERNAMES: Final = 100
# A text generation submitted, and its gen_metadata entries. A generation
# is bounded by its request's max_length (contract/generations.py, decision
# 0069): PROGRESS_BYTES_PER_TOKEN bytes of UTF-8 per token, as a job's
# progress posts are, plus GENERATION_ALLOWANCE_BYTES (a stop sequence a
# backend leaves in, a last token cut mid-character); a chat reply counts
# its content, reasoning and tool calls' names and arguments, and has
# CHAT_REPLY_ALLOWANCE_BYTES more (a backend's re-serialised call arguments,
# reasoning delimiters). Past it, the submit is refused: a worker that
# generates what its job asked for never comes near it.
GENERATION_ALLOWANCE_BYTES: Final = 4096
CHAT_REPLY_ALLOWANCE_BYTES: Final = 4096
MAX_GEN_METADATA: Final = 32
# A seed, as the AI Horde takes it: any signed 64-bit integer (its own worker
# bridge submits -1 with a faulted generation; the column is a BIGINT).
MIN_SEED: Final = -(2**63)
MAX_SEED: Final = 2**63 - 1
MAX_GEN_METADATA_CHARS: Final = 64
MAX_GEN_METADATA_REF_CHARS: Final = 255
# A submit's state is read up to this length, then checked against its names.
MAX_STATE_CHARS: Final = 16
# A user id in a route: digits, few enough to fit a 64-bit integer.
MAX_USER_ID_DIGITS: Final = 18
# A count given as text (the audit trail's limit, an entry id): as many
# digits, so that it fits a 64-bit integer.
MAX_COUNT_DIGITS: Final = MAX_USER_ID_DIGITS
# params.sampler_order names every one of the seven KoboldAI samplers.
MIN_SAMPLER_ORDER: Final = 7
MAX_STOP_SEQUENCES: Final = 128
# A stop sequence, text or chat, is at most this long.
MAX_STOP_SEQUENCE_CHARS: Final = 1000
MAX_POP_THREADS: Final = 50
# JSON bodies nest at most this deep: a chat request with a JSON schema in
# its response_format or tools needs about 20; past this a body is hostile.
MAX_JSON_DEPTH: Final = 64

# Chat request bounds.
MAX_CHAT_MESSAGES: Final = 4096
MAX_CHAT_STOP: Final = 4
MAX_CHAT_TOOLS: Final = 128
# A message's name, as OpenAI bounds it.
MAX_CHAT_NAME_CHARS: Final = 64
# A Responses API request's metadata, as OpenAI bounds it: at most 16
# pairs, keys of at most 64 characters, values of at most 512.
MAX_RESPONSE_METADATA_PAIRS: Final = 16
MAX_RESPONSE_METADATA_KEY_CHARS: Final = 64
MAX_RESPONSE_METADATA_VALUE_CHARS: Final = 512
# A request body of the specification's chat API is at most 36 MiB
# (server.max_body_bytes defaults to it).
MAX_CHAT_BODY_BYTES: Final = 36 * 1024 * 1024
# The longest chunk-size line of a chunked body (the size in hex, any
# extensions, the CRLF): a size needs at most 16 digits, and nothing
# hordelite reads comes in extensions (hordelite.http.wire).
MAX_CHUNK_LINE_BYTES: Final = 1024
# The Messages API's thinking.budget_tokens is at least this (Anthropic's
# bound, kept so that a body Anthropic refuses is refused here too).
MIN_THINKING_BUDGET_TOKENS: Final = 1024
# GET /v1/models in Anthropic's shape pages by ``limit``: 20 by default, 1
# to 1000 (Anthropic's own bounds, which its SDKs send).
MODELS_LIST_LIMIT: Final = 20
MAX_MODELS_LIST_LIMIT: Final = 1000
# The horde runs no tokenizer: a conversation is sized at 3 characters a token.
CHARS_PER_TOKEN_ESTIMATE: Final = 3
# Reply bounds a chat submit must keep (worker guide, "Submit refusals").
MAX_NATIVE_FINISH_REASON: Final = 32
MAX_REASONING_BYTES: Final = 1024 * 1024
MAX_REPORTED_TOKENS: Final = 10_000_000

# An image part of a chat request, as the horde checks it at submit before
# storing it as JPEG (contract/image_normalise.py): the bytes given, the
# pixels its header declares (checked before any pixel is decoded: a small
# file can declare a huge canvas) and the long side of the stored image.
MAX_IMAGE_BYTES: Final = 20 * 1024 * 1024
MAX_IMAGE_PIXELS: Final = 50_000_000
MAX_IMAGE_SIDE: Final = 2048
# Images normalised at once in a process: each decode and encode holds the
# GIL for long stretches, so more threads than this take the event loop's
# core from every other request (bench/images.py (b)). The turns go round
# robin between the accounts waiting (horde/fair_turns.py, decision 0070).
IMAGES_NORMALISED_AT_ONCE: Final = 1
# A signed image URL handed to a worker at pop is valid for the job's TTL,
# and at least this many seconds (the specification's floor).
MIN_IMAGE_URL_SECONDS: Final = 600.0
# A signed messages_url (an offloaded request's messages) handed at pop is
# valid this long: the worker fetches it right after the pop (the
# specification's value).
MESSAGES_URL_SECONDS: Final = 120.0

# The job lease: a pop's ttl (horde.job_ttl defaults to it; a worker assumes
# it when a pop names none).
DEFAULT_JOB_TTL: Final = 150.0

# Streaming progress (worker guide, "Streaming progress"): a job posts at most 1000
# times and 16 bytes per max_length token (content and reasoning together);
# each accepted post with new text ends the lease this long after the post,
# at most the cap after the pop (trusted or untrusted owner).
PROGRESS_MAX_POSTS: Final = 1000
PROGRESS_BYTES_PER_TOKEN: Final = 16
PROGRESS_LEASE_SECONDS: Final = 150.0
PROGRESS_CAP_TRUSTED: Final = 600.0
PROGRESS_CAP_UNTRUSTED: Final = 200.0
# How long an ended job's marker (404 ChatJobAborted) and an ended request's
# progress stream are kept, in seconds of the horde's clock: the marker as
# long as the longest lease, the stream long enough for a late reader.
ENDED_MARKER_SECONDS: Final = 600.0
STREAM_RETENTION_SECONDS: Final = 120.0
# The job lease preference (worker guide, "Streaming progress"): a chat job goes to a
# worker whose measured speed generates its max_length within this many
# seconds; a slower worker gets it only when no faster chat worker serving
# the model is online.
PREFERRED_SECONDS: Final = 120.0

# The anonymous key every AI Horde client knows.
ANONYMOUS_API_KEY: Final = "0000000000"
# The anonymous user's budgets are counted per client address (decision
# 0071); an IPv6 client is counted by its /64, the smallest network an ISP
# hands one subscriber: a client holds every address of its /64.
ANONYMOUS_IPV6_PREFIX: Final = 64
# The stored form of such a client: an IPv4 address, or a /64 as
# ``ffff:ffff:ffff:ffff::/64`` (24 characters).
MAX_CLIENT_KEY_CHARS: Final = 48
# An address or range a moderator writes (/operations/ipaddr, hordelite
# addresses): a stored form with room for a long IPv6 form and a prefix.
MAX_ADDRESS_TARGET_CHARS: Final = MAX_CLIENT_KEY_CHARS + 4

# Pricing (AI Horde text formula): tokens are estimated at 4 characters each,
# floored at 20, capped at max_length; a job is worth tokens x the model's
# size in billions of parameters / 21; the requester also pays 1 per job.
CHARS_PER_TOKEN_PRICING: Final = 4
MIN_BILLED_TOKENS: Final = 20
KUDOS_TOKENS_DIVISOR: Final = 21
HORDE_TAX_PER_JOB: Final = 1.0
# A model missing from the model reference is priced as a 1 billion
# parameter model, the smallest class the AI Horde knows.
UNKNOWN_MODEL_BILLIONS: Final = 1.0
# Requests with a larger max_length need their estimated cost up front.
UPFRONT_MAX_LENGTH: Final = 512

# Queue order: a waiting request gains 50 priority every 10 seconds.
AGING_PER_SECOND: Final = 50 / 10

# A worker with no measured speed is assumed to generate this many tokens a
# second when estimating wait times; a slower measured worker is "slow" and
# skipped by requests that set slow_workers: false.
ASSUMED_TOKENS_PER_SECOND: Final = 10.0
SLOW_WORKER_TOKENS_PER_SECOND: Final = 2.0

# How many of the best waiting requests an empty pop examines to fill in its
# ``skipped`` counts: bounded so that an empty pop costs the same with 100 or
# 100,000 waiting requests.
SKIPPED_SAMPLE: Final = 100
# Model statistics (status/models) are an aggregate over the queue: cached
# this long, in seconds.
MODEL_STATS_TTL: Final = 2.0
# A pop that finds nothing counts ``skipped`` over the best waiting requests
# as read at most this long ago: a burst of long-polls ending together (or
# many pops without wait) then reads and decodes them once, not once each.
SKIPPED_SAMPLE_SECONDS: Final = 1.0

# A status read is answered from the status cache while its request's
# version is unchanged. The queue position, wait time and is_possible of a
# request still waiting for a worker also move with the rest of the queue and
# the pool: those are re-read at most this long after they were read, as the
# AI Horde caches them (decision 0038).
STATUS_POSITION_SECONDS: Final = 1.0
# The online workers a submit's ``possible`` and a status read are checked
# against are read at most this long ago; a worker joining, leaving or
# declaring anew is seen at once (decision 0038).
POOL_SNAPSHOT_SECONDS: Final = 1.0
# The horde's modes are read at most this long ago by each process: a change
# through another process or replica is seen within it (at once through the
# pool version where Redis signals are shared). One small read a process
# per interval, never one per request.
MODES_SECONDS: Final = 2.0
# Anonymous clients a process throttles at once in raid mode (decision in
# hordelite.horde.modes): past it, a new client is refused as throttled.
RAID_THROTTLED_CLIENTS: Final = 100_000
# Each process looks whether the timeouts and blocks by address changed (one
# read of their version) at most this often, and re-reads them only when
# they did: a change made on another replica is enforced here within this,
# with no Redis; one made here, at once.
ADDRESS_RULES_SECONDS: Final = 2.0
# Statuses kept by the cache (the most recently read), and request versions
# kept by the in-process signals (the most recently changed).
STATUS_CACHE_ENTRIES: Final = 8192
# ... and at most this many bytes of generations among them (the least
# recently read go first): a status holds up to n generations of its bound
# (about 1.4 MB at n 20 and max_length 4096), and 8192 of those would be
# gigabytes. A status larger than an eighth of it is answered, not kept.
STATUS_CACHE_BYTES: Final = 64 * 1024 * 1024
REQUEST_VERSIONS: Final = 65536
# While the Redis signals are down, waiters do not wait for a signal longer
# than this: a waiting pop looks at the queue again, a waiting call re-reads
# its status (decision 0039).
DEGRADED_POLL_SECONDS: Final = 1.0
# A Redis command that takes longer than this counts as Redis being down.
REDIS_TIMEOUT_SECONDS: Final = 2.0
# Once a command found Redis down, the process's Redis calls fail fast (the
# circuit is open: each returns its fallback at once, no round trip), so a
# hung Redis (SIGSTOPped, a partition: connections open, no answers) costs a
# submit microseconds rather than REDIS_TIMEOUT_SECONDS each. A probe pings
# Redis every DEGRADED_POLL_SECONDS while the circuit is open, and closes it
# when a ping answers within this bound: short, since a ping answers in well
# under a millisecond when Redis is up, and a probe that waits longer only
# delays the next one (decision 0054).
REDIS_PROBE_TIMEOUT_SECONDS: Final = 0.5
# The longest ``wait`` of a long-polled status read
# (GET .../status/{id}?wait=N), in seconds.
MAX_STATUS_WAIT: Final = 60.0

# /readyz waits at most this long for the database to answer.
READY_CHECK_SECONDS: Final = 2.0

# The window in which aborted jobs are counted towards maintenance.
ABORT_WINDOW_SECONDS: Final = 3600.0

# A worker whose pop long-polled and found nothing pops again as the wait
# ends: it counts as online until then plus its wait again, and at least
# this many seconds more (a short wait must survive a slow round trip).
MIN_LONG_POLL_MARGIN: Final = 10.0

# Images a client names by http(s) URL, fetched by the horde at chat submit:
# at most this many bytes, within this many seconds overall (resolution,
# connection, redirects and body together), following at most this many
# redirects, each re-checked as a new URL.
MAX_IMAGE_FETCH_BYTES: Final = 20 * 1024 * 1024
IMAGE_FETCH_TIMEOUT: Final = 10.0
MAX_IMAGE_FETCH_REDIRECTS: Final = 3
# A request's images are taken in together (horde/request_images.py), so
# that slow hosts cost a submit seconds, not the sum of their times:
# - IMAGE_FETCH_DEADLINE: every http(s) image of a request is fetched
#   within this many seconds of the start of its intake, or the request is
#   refused naming the parts not fetched. Twice IMAGE_FETCH_TIMEOUT: one
#   image at its own limit fits, and so do two rounds of the per-request cap
#   at it (12 images each taking the full 10 s); a submit's fetching never
#   lasts longer, however many images it names.
# - IMAGE_FETCHES_PER_REQUEST: parts of one request taken in at once
#   (fetched or decoded, then normalised and stored). Six is what a browser
#   opens to one host, and a request's images often share a host: a
#   request knocks no harder than a page would. It also bounds the fetched
#   bytes a request holds at once (six times MAX_IMAGE_FETCH_BYTES).
# - IMAGE_FETCHES_PER_PROCESS: fetches in flight at once in a process,
#   across its requests. Each holds a socket and up to MAX_IMAGE_FETCH_BYTES
#   while it reads: 32 bounds that at 640 MiB in the worst case (images are
#   usually far smaller) and keeps five requests' worth of slow hosts from
#   taking every connection; a fetch past it waits, within its deadline.
IMAGE_FETCH_DEADLINE: Final = 2 * IMAGE_FETCH_TIMEOUT
IMAGE_FETCHES_PER_REQUEST: Final = 6
IMAGE_FETCHES_PER_PROCESS: Final = 32
# A refusal for that deadline names this many parts in its message (its
# ``errors`` names each): enough to find them, short enough to read.
MAX_LATE_IMAGES_NAMED: Final = 10

# Images the reference worker fetches from a job's signed URL (the horde's
# normalised JPEG, well under this) to hand its backend inline: at most this
# many bytes, within this many seconds overall.
MAX_WORKER_IMAGE_BYTES: Final = 20 * 1024 * 1024
WORKER_IMAGE_FETCH_TIMEOUT: Final = 30.0

# The dashboard's activity figures (/dashboard/activity): jobs done per
# bucket over the last window (jobs purged past the horde's retention count
# from the per-minute rollup the purge adds them to, which keeps a window's
# minutes), read once per cache period at most however many pages poll it.
# The bucket is a whole number of the rollup's minutes.
DASHBOARD_WINDOW_SECONDS: Final = 3600
DASHBOARD_BUCKET_SECONDS: Final = 60
DASHBOARD_CACHE_SECONDS: Final = 5.0

# Pages whose cost is bounded whatever the pool holds (decision 0048).
# GET /api/v2/workers and GET /api/v2/status/models answer one page of at
# most this many entries (``?page=N``, a hordelite extension, from 1): a
# worker may list 100 models of 255 characters, so a page of workers is the
# smaller one. A page number past MAX_PAGE is refused: no client needs it,
# and it bounds the offset a client can make the database skip.
WORKERS_PAGE: Final = 50
MODELS_PAGE: Final = 500
MAX_PAGE: Final = 100_000
# The longest page of the audit trail one read answers (the CLI's --limit,
# the admin route's limit): bounds what one read costs the database.
AUDIT_PAGE: Final = 500
# A worker's description (PUT /workers/{id} info), as the AI Horde bounds it.
MAX_WORKER_INFO: Final = 1000
# Messages to workers (POST /workers/messages): at most this many characters,
# lasting 1 hour to a year; listed this many a page; a pop carries the
# newest few of its worker's, from a snapshot of every active message read
# at most every MESSAGES_SECONDS (and again once one is sent or deleted).
MAX_WORKER_MESSAGE: Final = 2000
MAX_MESSAGE_HOURS: Final = 24 * 365
MESSAGES_PAGE: Final = 50
MESSAGES_PER_POP: Final = 10
MAX_ACTIVE_MESSAGES: Final = 10_000
MESSAGES_SECONDS: Final = 30.0
# GET /api/v2/users answers pages of this many users, as the AI Horde does.
USERS_PAGE: Final = 25

# The operator's notices ([notices] in hordelite.toml): terms, privacy policy
# and news, each at most this many characters (they are answered whole).
MAX_NOTICE_CHARS: Final = 64 * 1024
# The AI Horde's levels of a piece of news.
NEWS_IMPORTANCE: Final = ("Information", "Workers", "Minor", "Major", "Crisis")
# GET /api/v2/status/performance sums the whole queue and pool: read at most
# this often, in seconds, however many clients ask.
PERFORMANCE_TTL: Final = 5.0
# GET /api/v2/stats/text/*: summed over every stored job, at most this often.
STATS_TTL: Final = 60.0
# The dashboard (GET / and GET /dashboard/pool) shows the models with most
# threads, the workers with most jobs done and, for each worker, its first
# models, each with how many more there are; the playground offers the chat
# models with most chat workers. Both answers are rendered at most once per
# DASHBOARD_POOL_SECONDS, however many pages poll them.
DASHBOARD_MODELS: Final = 20
DASHBOARD_WORKERS: Final = 20
DASHBOARD_WORKER_MODELS: Final = 3
DASHBOARD_CHAT_MODELS: Final = 20
DASHBOARD_POOL_SECONDS: Final = 2.0
# /metrics labels the queue depth of at most this many served models (those
# with most waiting jobs); the other served models are summed under one
# label. The queue depth (an aggregate of the whole queue) is read at most
# once per METRICS_READ_SECONDS, however many scrapers there are; the
# workers and threads online come from the pool snapshot, as before.
METRICS_MODELS: Final = 50
METRICS_READ_SECONDS: Final = 1.0
# An OpenAI call is its request's only reader (decision 0051). Each serving
# process holds a reader lease for its open calls, renewed every
# READER_RENEW_SECONDS to READER_LEASE_SECONDS ahead: a process that died
# without restarting stops renewing, and the sweep then cancels the requests
# of its calls, uncharged. Three renewals fit in one lease, so one slow
# write does not lose live calls.
READER_LEASE_SECONDS: Final = 30.0
READER_RENEW_SECONDS: Final = 10.0
# The longest reader name: host name, port and process slot.
MAX_READER_CHARS: Final = 300
# A draining process answers the calls it could not finish this long before
# its grace period ends, so the answer leaves before the server cancels it.
DRAIN_ANSWER_MARGIN: Final = 1.0
# Webhooks (decision 0056): a text request's ``webhook`` is called once when
# the request ends, by a background task of the serving processes, never on
# a request's path. Each call must be answered within WEBHOOK_TIMEOUT (the
# AI Horde gives 3 s; a receiver on a slow host gets more here); a call that
# fails is tried again after each of WEBHOOK_BACKOFF's delays in turn, then
# given up (WEBHOOK_TRIES calls in all). A call refused by the address
# policy is given up at once: trying again would knock again.
WEBHOOK_TIMEOUT: Final = 10.0
WEBHOOK_BACKOFF: Final = (2.0, 10.0, 60.0)
WEBHOOK_TRIES: Final = len(WEBHOOK_BACKOFF) + 1
# A claimed call not settled within this many seconds (its process died
# while calling) is due again: a process restarting, or another one, makes
# it. The claim outlasts one call's whole time limit.
WEBHOOK_CLAIM_SECONDS: Final = WEBHOOK_TIMEOUT + 20.0
# Calls one process makes at once (each holds a socket while it waits), and
# of them at most WEBHOOK_CALLS_PER_REQUESTER for one requester's requests
# (per user: the anonymous user is one requester), so that one requester's
# receivers that hang hold at most that many of the process's calls while
# every other requester's are made. Each call is made on its own as a slot
# frees; a claim takes at most WEBHOOK_CLAIM_BATCH of the calls due, those
# of requesters at their bound left due for a later claim.
WEBHOOK_CALLS_IN_FLIGHT: Final = 128
WEBHOOK_CALLS_PER_REQUESTER: Final = 8
WEBHOOK_CLAIM_BATCH: Final = 16
# A receiver's answer is read (and dropped) up to this many bytes, so that
# its connection can carry the next call; a longer one is closed unread.
WEBHOOK_ANSWER_BYTES: Final = 64 * 1024
# How often each process looks for calls due that no ending in this process
# announced: another process's ends, retries, claims of a process gone.
WEBHOOK_POLL_SECONDS: Final = 1.0
# Shared keys (decision 0058): a user lends a key whose requests it pays
# for, within the key's kudos and limits. Each user holds at most
# SHARED_KEYS_PER_USER; a new key's kudos default to the AI Horde's 5000;
# -1 is unlimited (kudos, limits) or never (expiry, in days).
SHARED_KEYS_PER_USER: Final = 10
DEFAULT_SHARED_KEY_KUDOS: Final = 5000
MAX_SHARED_KEY_KUDOS: Final = 10**12
MAX_SHARED_KEY_DAYS: Final = 36500
MAX_SHARED_KEY_LIMIT: Final = 2**31 - 1
# A user's name: at most this many characters, no '#' (users are shown as
# name#id), no control characters.
MAX_USERNAME: Final = 100
# The most requests in flight an admin may grant one user.
MAX_CONCURRENCY: Final = 100_000
# Prompt filters (docs/reference/filters.md): a rule's regex has at most
# MAX_FILTER_REGEX_CHARS characters, its description and replacement at most
# MAX_FILTER_TEXT_CHARS, and a horde holds at most MAX_FILTERS rules; each
# compiled RE2 program may use at most FILTER_RE2_MEMORY bytes. Matching is
# linear in the text (RE2), so these bound a screen's cost with the rules'.
MAX_FILTER_REGEX_CHARS: Final = 1000
MAX_FILTER_TEXT_CHARS: Final = 1000
MAX_FILTERS: Final = 1000
FILTER_RE2_MEMORY: Final = 8 << 20
# Filter types, the AI Horde's (10..29; 10-19 one suspicion group, 20-29
# another).
MIN_FILTER_TYPE: Final = 10
MAX_FILTER_TYPE: Final = 29
# How long a process serves its compiled filters before it reads their
# revision again (one small read): a filter changed on another process or
# replica applies here within this many seconds.
FILTERS_CHECK_SECONDS: Final = 2.0

# The moderation review routes (/operations/moderation): the AI Horde's
# bounds of a page of prompt events, of a page of worker suspicion events
# and of each section of the overview, and of a moderator's note.
PROMPT_EVENTS_PAGE: Final = 100
SUSPICION_EVENTS_PAGE: Final = 500
OVERVIEW_SECTION: Final = 500
MAX_PROMPT_NOTE: Final = 2000
