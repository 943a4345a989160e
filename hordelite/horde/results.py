"""What the horde service answers, as frozen dataclasses.

The service returns these; each envelope renders its own: the native AI
Horde JSON in ``hordelite.api``, the OpenAI shapes in ``hordelite.front``.
Nothing here knows either envelope.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hordelite.contract.chat_reply import ChatReply
from hordelite.contract.faults import Fault
from hordelite.contract.user_edit import UserEdit
from hordelite.errors import RC
from hordelite.storage.requests import SubmittedText
from hordelite.storage.shared_keys import SharedKeyRecord

# A text request as queued: storage's record is already the answer's shape.
SubmittedRequest = SubmittedText


@dataclasses.dataclass(frozen=True)
class Impossible:
    """Why no online worker can take a waiting chat request (decision 0017)."""

    rc: RC
    message: str


@dataclasses.dataclass(frozen=True)
class Generation:
    """A finished job: who made it, and its text (a text job) or its verified
    reply with what it cost (a chat job)."""

    worker_id: str
    worker_name: str
    model: str
    state: str | None  # the worker's gen_state: "ok" or "censored"
    id: str = ""  # the job's
    text: str | None = None
    seed: int = 0
    gen_metadata: tuple[dict[str, Any], ...] = ()
    reply: ChatReply | None = None
    kudos: float | None = None
    charge_basis: str | None = None


@dataclasses.dataclass(frozen=True)
class RequestStatus:
    """A request's status (text or chat).

    ``generations`` are the finished jobs. ``free_threads``: the threads of the eligible online workers not
    busy with a job, counted only when asked for (the front's fail_fast
    check) and while the request waits for a worker; None otherwise.
    ``eligible_workers`` and ``eligible_threads``: the online workers that
    can serve it and their threads, counted while it waits in the queue
    (0 once every job is handed out).
    """

    kind: str
    finished: int
    processing: int
    restarted: int
    waiting: int
    done: bool
    faulted: bool
    wait_time: int
    queue_position: int
    kudos: float
    is_possible: bool
    generations: tuple[Generation, ...]
    impossible: Impossible | None = None
    context_adjustments: list[dict[str, Any]] | None = None
    fault: Fault | None = None
    free_threads: int | None = None
    eligible_workers: int = 0
    eligible_threads: int = 0


@dataclasses.dataclass(frozen=True)
class PoppedJob:
    """A job handed to a worker, as its pop answer carries it."""

    id: str
    model: str
    payload: dict[str, Any]
    softprompt: str | None
    ttl: float
    chat: bool


@dataclasses.dataclass(frozen=True)
class WorkerMessage:
    """A message to a worker; ``expiry``: hours until it expires, rounded up."""

    id: str
    worker_id: str
    message: str
    origin: str | None
    expiry: int


@dataclasses.dataclass(frozen=True)
class PopAnswer:
    """A pop's answer: the job, or none with the skipped counts, and the
    worker's active messages."""

    job: PoppedJob | None
    skipped: dict[str, int]
    messages: tuple[WorkerMessage, ...] = ()


@dataclasses.dataclass(frozen=True)
class UserAnswer:
    """A user as the horde shows it. ``kudos`` and ``kudos_earned`` are to
    the hundredth; ``concurrency`` is the user's own or the horde's default
    for its kind of user (anonymous or registered)."""

    id: int
    username: str
    kudos: float
    kudos_earned: float
    concurrency: int
    worker_ids: tuple[str, ...]
    trusted: bool
    moderator: bool
    kudos_gifted: float = 0.0
    kudos_received: float = 0.0
    account_age: int = 0  # seconds since the user was created
    # The ids of the shared keys it lent, shown to itself (None: not shown).
    sharedkey_ids: tuple[str, ...] | None = None
    # Found by one of its shared keys (find_user): that key's name.
    via_shared_key: str | None = None


@dataclasses.dataclass(frozen=True)
class UserModified:
    """What ``PUT /users/{id}`` changed (``edit``), and the user after it."""

    edit: UserEdit
    user: UserAnswer


@dataclasses.dataclass(frozen=True)
class UserListing:
    """One page of the users, and how many there are in all."""

    users: tuple[UserAnswer, ...]
    total: int


@dataclasses.dataclass(frozen=True)
class WorkerAnswer:
    """A worker as the horde shows it. ``online``: checked in within the
    presence window now; ``kudos_rewards``: to the hundredth; ``speed``: the
    tokens per second it measured; ``chat``: the declaration of its last
    pop, as sent (unknown names dropped), None when it takes no chat jobs."""

    id: str
    name: str
    owner: str
    online: bool
    trusted: bool
    maintenance: bool
    nsfw: bool
    threads: int
    models: tuple[str, ...]
    max_length: int
    max_context_length: int
    bridge_agent: str
    uptime: float
    requests_fulfilled: int
    uncompleted_jobs: int
    kudos_rewards: float
    speed: float
    prompt_jobs: bool
    nonconformant_replies: int
    chat: dict[str, Any] | None
    info: str | None = None
    paused: bool = False
    tokens_generated: int = 0
    suspicious: int = 0  # its suspicion (contract.suspicion)


@dataclasses.dataclass(frozen=True)
class DeletedWorkerAnswer:
    """The id and name a deleted worker had."""

    id: str
    name: str


@dataclasses.dataclass(frozen=True)
class WorkerUpdate:
    """What a worker update changed; None: left as it was."""

    maintenance: bool | None
    aborts_in_window: int | None
    online: bool | None
    info: str | None = None
    name: str | None = None
    paused: bool | None = None
    team: str | None = None
    new_suspicion: int | None = None


@dataclasses.dataclass(frozen=True)
class ModelStats:
    """A model of the online workers with its queue. ``performance``: the
    thread-weighted mean tokens per second; ``queued``: the tokens of its
    waiting jobs; ``eta``: seconds to clear them. ``chat``: its online chat
    workers, their largest limits and the union of their features, in the
    shape both envelopes show (None: not asked for, or no chat worker).
    ``workers``: the online workers out of maintenance that list it (the
    dashboard shows it; the AI Horde's entry has no such field)."""

    name: str
    count: int
    performance: float
    queued: int
    jobs: int
    eta: int
    chat: dict[str, Any] | None = None
    workers: int = 0


@dataclasses.dataclass(frozen=True)
class ModelPage:
    """One page of the models served (most threads first), and how many
    are served in all."""

    models: tuple[ModelStats, ...]
    total: int


@dataclasses.dataclass(frozen=True)
class WorkerListing:
    """One page of the online workers, and how many are online in all."""

    workers: tuple[WorkerAnswer, ...]
    total: int


@dataclasses.dataclass(frozen=True)
class PoolOverview:
    """What the dashboard shows of the pool, each list capped: the models
    with most threads, the workers with most jobs done, the chat models the
    playground offers (those with most chat workers), each with how many
    there are in all."""

    models: tuple[ModelStats, ...]
    models_total: int
    workers: tuple[WorkerAnswer, ...]
    workers_total: int
    chat_models: tuple[str, ...]
    chat_models_total: int


@dataclasses.dataclass(frozen=True)
class Performance:
    """The horde's load (/status/performance): text requests waiting for a
    worker and the tokens they ask for, the online text workers and their
    threads, and the tokens generated in the last minute."""

    queued_requests: int
    queued_tokens: int
    workers: int
    threads: int
    past_minute_tokens: int


@dataclasses.dataclass(frozen=True)
class NewsPiece:
    """One piece of the operator's news ([notices])."""

    title: str
    text: str
    importance: str
    published: str  # YYYY-MM-DD, or "" when the operator gave no date


@dataclasses.dataclass(frozen=True)
class Document:
    """One of the operator's documents, in the format asked for."""

    format: str  # html or markdown
    text: str


@dataclasses.dataclass(frozen=True)
class RequestWarning:
    """Something a queued request should know (``code``: the AI Horde's
    warning codes, and hordelite's own)."""

    code: str
    message: str


@dataclasses.dataclass(frozen=True)
class Queued:
    """A queued request (text or chat), or the first one again for a
    resubmit with its operation key. ``kudos``: what it costs up front;
    ``message``: why it waits, when no online worker can serve it now."""

    id: str
    kudos: float
    context_adjustments: list[dict[str, Any]] | None = None
    message: str | None = None
    warnings: tuple[RequestWarning, ...] = ()


@dataclasses.dataclass(frozen=True)
class Quote:
    """A dry run's answer: what the request would cost up front; nothing queued."""

    kudos: float


@dataclasses.dataclass(frozen=True)
class ProgressAnswer:
    """A progress post accepted. ``cancelled``: the request was cancelled,
    the worker stops."""

    accepted_seq: int
    cancelled: bool


@dataclasses.dataclass(frozen=True)
class SubmitAnswer:
    """A worker's submit accepted: the kudos it earned."""

    reward: float


@dataclasses.dataclass(frozen=True)
class SharedKeyAnswer(SharedKeyRecord):
    """A shared key's details (``/sharedkeys``): the record storage keeps,
    with its id. Kudos -1 is unlimited, an expiry of None never, a limit of
    -1 none."""

    id: str
