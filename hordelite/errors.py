"""Every return code hordelite answers with, defined once, and the root of
every exception hordelite raises.

A return code (``rc``) has an HTTP status and a default message. Code raises
``HordeError(RC.X)`` (optionally with a more precise message and extra fields);
each envelope renders it its own way: the native API as
``{"message", "rc", ...extra}``, the OpenAI front in its error object.

Every exception class of the package derives from ``HordeliteError``, so a
caller embedding hordelite can tell its failures from everyone else's with
one ``except``. Handlers inside hordelite catch the precise class:

    Exception
     +-- HordeliteError             every exception hordelite defines
          +-- HordeError            a refusal a client or worker can act on (rc)
          +-- StorageUnavailable    the database did not answer (rendered 503)
          |    +-- blobs.S3Error     the object store refused or did not answer
          +-- ConfigError           a bad configuration value, raised at start
          +-- contract.image_normalise.ImageRefused  an image part the horde
          |                         does not store (reason and message; the
          |                         caller answers 400 naming the part)
          +-- guarded_fetch.ImageFetchRefused  an image URL not fetched (reason)
          +-- contract.signing.BlobKeyError  a blob key a store refuses
          +-- worker.WorkerError    the reference worker cannot run (the
          |                         message says what to change)
          +-- worker: HordeUnavailable, HordeRefusal (the horde's answers),
          |   BackendError (the LLM backend's), UnsendableJob (a job no
          |   backend can be sent)
          +-- storage.jobs.Unjudged  a chat reply whose job changed hands
          |                         since it was judged (the horde judges it
          |                         again)
          +-- private control flow that never leaves its module: the
              database's _Busy, the fake backend's _BadRequest
"""

from __future__ import annotations

import enum
from typing import Any


class RC(enum.Enum):
    """Return codes with their HTTP status and default message.

    Names and statuses are the AI Horde's where it has one, so that existing
    clients keep recognising them.
    """

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.default_message = message

    # 400
    BadRequest = (400, "Input payload validation failed.")
    MissingPrompt = (400, "You cannot specify an empty prompt.")
    TokenOverflow = (400, "max_context_length must be at least max_length.")
    TooManyStopSequences = (400, "Too many stop sequences were given.")
    ExcessiveStopSequence = (400, "A stop sequence is too long.")
    DuplicateGen = (400, "This generation has already been submitted.")
    NoWorkerModSelected = (400, "No worker modification selected.")
    NoSharedKeyModSelected = (400, "No shared key modification selected.")
    NoValidActions = (400, "No usermod operations selected!")
    # PUT /status/modes setting no mode (the AI Horde's).
    NoHordeModSelected = (400, "No mod change selected!")
    # The horde's maintenance mode: no new request (the AI Horde's status).
    MaintenanceMode = (400, "This horde has entered maintenance mode. Please try again later.")
    # Prompt filters (docs/reference/filters.md), with the AI Horde's codes;
    # a refusal never echoes what matched.
    CorruptPrompt = (
        400,
        "This prompt appears to violate this horde's terms of service. "
        "Please contact its operators if you think this is an error.",
    )
    NoFilterModSelected = (400, "No filter modification selected.")
    TooManyFilters = (400, "This horde holds as many filters as it may.")
    # A user's name is another's under Unicode normalisation (decision 0073).
    UsernameAlreadyExists = (400, "Another user already has this name.")
    # Kudos transfers, with the AI Horde's codes.
    InvalidTargetUsername = (400, "No user has this username.")
    KudosTransferToAnon = (400, "Kudos cannot be sent to the anonymous user.")
    KudosTransferToSelf = (400, "Kudos cannot be sent to yourself.")
    KudosTransferNotEnough = (400, "Not enough kudos for this transfer.")
    NegativeKudosTransfer = (400, "A transfer must move more than 0 kudos.")
    KudosTransferFromAnon = (400, "The anonymous user cannot send kudos.")
    NameAlreadyExists = (400, "Another worker already has this name.")
    UnsupportedChatParameter = (400, "This request uses a parameter this horde does not support.")
    ChatRequestInvalid = (400, "This chat request is not valid.")
    ChatDeclarationInvalid = (400, "The chat declaration of this pop is not valid.")
    ChatSubmitInvalid = (400, "This chat submit is not a valid reply.")
    ChatSubmitNonconformant = (400, "This reply does not follow the request's contract.")
    ChatModelMismatch = (400, "The submit names another model than the one the job was assigned.")
    ChatProgressOutOfSequence = (409, "This progress post is out of sequence.")
    ChatProgressNotStreaming = (404, "This job does not stream progress.")
    ChatJobAborted = (404, "This job has ended: stop generating and do not submit.")
    ChatProgressCapReached = (413, "This job has posted all the progress it may.")
    ChatProgressUnavailable = (503, "Progress cannot be recorded right now; keep generating.")
    MaxKudosExceeded = (400, "This request would cost more than its horde.max_kudos.")
    no_worker_supports_limit = (
        400,
        "No online worker serving this model accepts a request this large.",
    )
    # A pop declaring more models than budgets.models_per_worker allows.
    TooManyModels = (400, "This worker declares more models than this horde allows.")
    AbortedGen = (400, "This generation was aborted: its lease expired or the request ended.")
    # 401
    InvalidAPIKey = (401, "No user matching the sent API key.")
    # 403
    AnonForbiddenWorker = (403, "The anonymous user cannot run a worker: register a key.")
    AnonymousDisabled = (
        403,
        "Anonymous requests are turned off on this horde: send a registered key.",
    )
    WrongCredentials = (403, "Wrong credentials: this belongs to another user.")
    WorkerMaintenance = (403, "This worker is in maintenance mode.")
    # A new worker name while the horde is closed to new workers (invite-only
    # or raid mode: one answer for both, so that raid mode does not show).
    WorkerInviteOnly = (403, "This horde takes new workers only from trusted users right now.")
    NotModerator = (403, "Only an admin of this horde may do this.")
    # An address (or its range) timed out or blocked (contract.addresses).
    TimeoutIP = (403, "Due to abuse prevention, your IP address has been put into timeout.")
    KudosUpfront = (403, "This request needs kudos up front.")
    # Shared keys, with the AI Horde's codes.
    SharedKeyEmpty = (403, "This shared key has run out of kudos.")
    SharedKeyExpired = (403, "This shared key has expired.")
    SharedKeyInsufficientKudos = (403, "This shared key has too few kudos left for this request.")
    AnonForbidden = (403, "The anonymous user cannot do this: register a key.")
    AnonForbiddenUserMod = (403, "The anonymous user cannot be changed.")
    Forbidden = (403, "This is not allowed.")
    # A pop that would register one worker more than budgets.workers_per_user.
    TooManyWorkers = (403, "This account has as many workers as it may register.")
    BlobURLInvalid = (403, "This blob URL is not valid: it was altered or has expired.")
    # 404
    RequestNotFound = (404, "No request with this id.")
    InvalidJobID = (404, "No job with this id.")
    WorkerNotFound = (404, "No worker with this id.")
    UserNotFound = (404, "No user with this id.")
    TeamNotFound = (404, "No team with this id.")
    MessageNotFound = (404, "No message to a worker with this id.")
    FilterNotFound = (404, "No filter with this id.")
    PromptEventNotFound = (404, "No prompt moderation event with this id.")
    BlobNotFound = (404, "No blob with this key.")
    NotFound = (404, "No such route.")
    model_not_found = (404, "The model does not exist on this horde.")
    # OpenAI's codes for a stored Response (decision 0078): one that is not
    # there for this key, read or deleted, and one a request continues.
    response_not_found = (404, "No stored response with this id.")
    previous_response_not_found = (400, "No stored response with this id to continue.")
    no_worker_supports_features = (
        404,
        "No online worker serving this model declares what this request needs.",
    )
    # 405, 413, 429
    MethodNotAllowed = (405, "This method is not allowed on this route.")
    RequestTimeout = (408, "The request did not complete within the time allowed.")
    # Shown in a status's fault (not answered as an error): no worker took
    # the request before it expired.
    RequestExpired = (408, "No worker took this request before it expired.")
    OperationKeyReused = (409, "This Idempotency-Key was used for a different request.")
    PayloadTooLarge = (413, "The request body is larger than this horde accepts.")
    # One request larger than a per-user budget allows on its own.
    RequestTooLarge = (413, "This request is larger than this account may store.")
    TooManyImages = (413, "This request has more images than this account may send in one.")
    TooManyPrompts = (429, "You have too many requests in flight.")
    # Per-user budgets (budgets.*), each answered with Retry-After.
    RequestRateExceeded = (429, "This account queued as many requests as it may this minute.")
    StoredBytesExceeded = (429, "This account's requests hold as many bytes as it may store.")
    # 5xx
    InternalServerError = (500, "The horde failed unexpectedly.")
    ChatWorkerFault = (502, "The worker could not serve this request.")
    ChatRequestFaulted = (502, "The request faulted: its workers could not serve it.")
    ChatStreamDiverged = (502, "The final reply differs from the text already streamed.")
    no_eligible_worker = (503, "No online worker serves this model.")
    FrontAtCapacity = (503, "The front holds as many open calls as it may; try again shortly.")
    ShuttingDown = (503, "The horde is stopping.")
    queue_unavailable = (503, "No eligible worker can take this request soon enough.")
    StorageUnavailable = (503, "The horde's database did not answer; try again shortly.")


class HordeliteError(Exception):
    """The root of every exception hordelite defines."""


class HordeError(HordeliteError):
    """A refusal with a return code. ``extra`` fields are added to the body."""

    def __init__(self, rc: RC, message: str | None = None, **extra: Any) -> None:
        self.rc = rc
        self.message = message or rc.default_message
        self.extra = extra
        super().__init__(f"{rc.name}: {self.message}")

    @property
    def status(self) -> int:
        return self.rc.status


def bad_request(field: str, why: str) -> HordeError:
    """A validation failure naming the field, with the AI Horde's ``errors`` map."""
    return HordeError(RC.BadRequest, f"{field}: {why}", errors={field: why})


class StorageUnavailable(HordeliteError):
    """The database could not be reached; translated from driver errors."""


class ConfigError(HordeliteError):
    """A configuration value is wrong; the message names the key."""
