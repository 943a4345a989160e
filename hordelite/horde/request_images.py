"""Images at submit and at pop: the horde takes them in, workers get them by
their declared transport.

At submit every ``image_url`` part is read (a ``data:`` URL decoded, an
``http(s)`` URL fetched with hordelite.outbound.guarded_fetch), checked and normalised
to JPEG (contract/image_normalise.py, in a thread), and stored in the blob store; the
stored request keeps only a reference (``hordelite-blob:<key>/<jpeg bytes>``).
A request's parts are taken in together, a few at a time, its fetches under
one deadline, so that slow hosts cost a submit about one image's time, not
the sum of theirs (decision 0042). Each image's bytes count against its
account's image budget as they arrive, and the normalising threads are
shared round robin between accounts (decision 0070). At pop,
after the transaction, each reference becomes what the worker declared: a
signed URL for a ``url`` worker, an inline ``data:image/jpeg`` URL for a
``base64``-only one. A large request (``images.offload_bytes``) goes to a
worker that declared ``messages_url`` as one signed URL of its messages,
images inlined, stored at its first such pop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread

from hordelite.blobs import BlobStore
from hordelite.contract.chat_features import IMAGE_TRANSPORT_BITS, MESSAGES_URL_BIT
from hordelite.contract.chat_request import BLOB_REFERENCE, ChatRequest
from hordelite.contract.eligibility import WorkerView
from hordelite.contract.image_normalise import (
    DATA_URL_PREFIX,
    ImageRefused,
    NormalisedImage,
    data_url,
    data_url_bytes,
    normalise,
    parse_data_url,
)
from hordelite.contract.limits import (
    IMAGE_FETCH_DEADLINE,
    IMAGE_FETCHES_PER_REQUEST,
    MAX_IMAGE_FETCH_BYTES,
    MAX_LATE_IMAGES_NAMED,
    MESSAGES_URL_SECONDS,
    MIN_IMAGE_URL_SECONDS,
)
from hordelite.errors import RC, HordeError
from hordelite.horde.fair_turns import FairTurns
from hordelite.horde.image_allowance import ImageAllowance
from hordelite.outbound.guarded_fetch import ImageFetchRefused, fetch_image, parse_target

JPEG = "image/jpeg"
JSON = "application/json"
# Offloaded messages sit beside the request's images, keyed
# ``<request id>-messages``, so the purge of ``<request id>-*`` takes them too.
MESSAGES_KEY_SUFFIX = "messages"


def _image_parts(messages: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each image part with the path a refusal names."""
    for i, message in enumerate(messages):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if part.get("type") == "image_url":
                yield f"messages[{i}].content[{j}].image_url", part


def _from_data_url(url: str) -> NormalisedImage:
    return normalise(parse_data_url(url))


def image_keys(request_id: str, req: ChatRequest) -> list[str]:
    """The blob keys the request's images are stored under."""
    return [f"{request_id}-{n}" for n, _ in enumerate(_image_parts(req.messages))]


@dataclasses.dataclass
class _Part:
    """One image part of a request while it is taken in, and how that went."""

    where: str
    part: dict[str, Any]
    key: str
    # Its bytes are in hand (a data: URL's from the start): a part without
    # them when the deadline passes was not fetched in time.
    in_hand: bool
    refusal: str | None = None
    error: Exception | None = None
    jpeg_bytes: int = 0
    # Its bytes counted against the account's image budget: as received,
    # then the JPEG's.
    counted: int = 0

    @property
    def url(self) -> str:
        return str(self.part["image_url"]["url"])

    @property
    def failed(self) -> bool:
        return self.refusal is not None or self.error is not None


@dataclasses.dataclass
class _Intake:
    """What a request's parts share while they are taken in."""

    store: BlobStore
    fetch_private: bool
    # The normalising threads, shared round robin by account (unbounded for
    # a caller with none).
    turns: FairTurns | None
    # The account's image budget (no limit for a caller with none); its
    # account takes the turns.
    allowance: ImageAllowance | None
    # Fetches in flight in the process (unbounded for a caller with none).
    fetches: anyio.CapacityLimiter
    # Parts of this request in progress at once, taken in message order.
    slots: anyio.Semaphore
    # When every fetch must be done (anyio's clock), and the seconds it allows.
    fetch_by: float
    seconds: float
    # Every key put or being put, deleted when the request is not taken.
    stored: list[str] = dataclasses.field(default_factory=list)
    # The deadline passed with a part not fetched.
    late: bool = False


def _copied(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies down to the parts, which take_images replaces: the caller's
    request stays as parsed."""
    return [
        {**m, "content": [{**part} for part in m["content"]]}
        if isinstance(m.get("content"), list)
        else {**m}
        for m in messages
    ]


async def take_images(
    req: ChatRequest,
    store: BlobStore,
    request_id: str,
    *,
    fetch_private: bool,
    turns: FairTurns | None = None,
    allowance: ImageAllowance | None = None,
    fetches: anyio.CapacityLimiter | None = None,
    deadline: float | None = None,
    at_once: int | None = None,
) -> ChatRequest:
    """The request with each image read, checked, normalised to JPEG and
    stored under ``image_keys``.

    The parts are taken in together, at most ``at_once``
    (IMAGE_FETCHES_PER_REQUEST) at a time in message order, each http(s)
    fetch also holding one of ``fetches`` (the process's bound); every fetch
    must be done within ``deadline`` (IMAGE_FETCH_DEADLINE) seconds. A bad
    image, or a part not fetched in time, is refused with 400
    ChatRequestInvalid naming the part (the first in message order of
    those that failed); the parts still in progress are then cancelled, and
    on any failure or cancellation what was stored of the request is
    deleted. ``turns`` bounds the normalising threads, a turn taken for
    each image by ``allowance``'s account, which counts each image against
    its image budget as it arrives and as stored (``_read``)."""
    if not req.has_images:
        return req
    messages = _copied(req.messages)
    parts = [
        _Part(
            where, part, f"{request_id}-{n}", in_hand=part["image_url"]["url"].startswith("data:")
        )
        for n, (where, part) in enumerate(_image_parts(messages))
    ]
    # Read here, not as defaults, so that a test can set the module's values.
    seconds = IMAGE_FETCH_DEADLINE if deadline is None else deadline
    intake = _Intake(
        store,
        fetch_private,
        turns,
        allowance,
        anyio.CapacityLimiter(math.inf) if fetches is None else fetches,
        anyio.Semaphore(IMAGE_FETCHES_PER_REQUEST if at_once is None else at_once),
        anyio.current_time() + seconds,
        seconds,
    )
    try:
        await _take_all(parts, intake)
        _raise_first_failure(parts, intake)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await store.delete(intake.stored)
        raise
    for p in parts:
        # The JPEG's size rides along, so that whether a request needs
        # offloading is known at pop without reading its images.
        reference = f"{BLOB_REFERENCE}{p.key}/{p.jpeg_bytes}"
        p.part["image_url"] = {**p.part["image_url"], "url": reference}
    return dataclasses.replace(req, messages=messages)


async def _take_all(parts: list[_Part], intake: _Intake) -> None:
    """Each part taken in by a task of its own, started in message order as
    a slot frees; the first failure cancels the rest (take_images'
    task group: nothing of the request runs once it returns)."""
    async with anyio.create_task_group() as tg:
        for p in parts:
            # Waiting for a turn counts against the deadline for a part that
            # is to be fetched: its fetch cannot be done by then otherwise.
            with anyio.CancelScope(deadline=math.inf if p.in_hand else intake.fetch_by) as turn:
                await intake.slots.acquire()
            if turn.cancelled_caught:
                intake.late = True
                tg.cancel_scope.cancel()
                return
            tg.start_soon(_take_part, p, intake, tg.cancel_scope)


async def _take_part(p: _Part, intake: _Intake, group: anyio.CancelScope) -> None:
    """Read, normalise and store one part. A failure is kept on the part (the
    task group would wrap it in an exception group, and take_images must
    choose among the failures) and cancels the request's other parts."""
    try:
        image = await _read(p, intake)
        if image is None:  # the deadline passed before its bytes came
            intake.late = True
            group.cancel()
            return
        # Counted before it is stored: the blob store never holds more than
        # the budget allows (but for the races named in image_allowance).
        _count(p, intake, len(image.jpeg))
        # Listed before the put: a put cut short may still have written it.
        intake.stored.append(p.key)
        await intake.store.put(p.key, image.jpeg, JPEG)
        p.jpeg_bytes = len(image.jpeg)
    except (ImageRefused, ImageFetchRefused) as refused:
        p.refusal = str(refused)
        group.cancel()
    except Exception as error:  # raised again by take_images, as it came
        p.error = error
        group.cancel()
    finally:
        intake.slots.release()


def _count(p: _Part, intake: _Intake, size: int) -> None:
    """Count the part at ``size`` bytes against the account's image budget
    in place of what was counted; raises the budget's refusal."""
    if intake.allowance is not None:
        p.counted = intake.allowance.change(p.counted, size)


async def _read(p: _Part, intake: _Intake) -> NormalisedImage | None:
    """The part's image normalised, or None when its fetch was not done by
    the deadline."""
    # Decoding (base64, then the image) and encoding take a while: in a
    # thread, the account's turn held (``turns`` bounds how many at once in
    # the process, since the threads share its core with the event loop).
    if p.in_hand:
        _count(p, intake, data_url_bytes(p.url))
        async with _turn(intake):
            return await anyio.to_thread.run_sync(_from_data_url, p.url)
    data = await _fetch(p.url, intake)
    if data is None:
        return None
    p.in_hand = True
    _count(p, intake, len(data))
    async with _turn(intake):
        return await anyio.to_thread.run_sync(normalise, data)


@contextlib.asynccontextmanager
async def _turn(intake: _Intake) -> AsyncIterator[None]:
    if intake.turns is None:
        yield
    else:
        account = None if intake.allowance is None else intake.allowance.account
        async with intake.turns.turn(account):
            yield


async def _fetch(url: str, intake: _Intake) -> bytes | None:
    """The bytes at ``url`` (guarded_fetch, its own time limit kept), or None
    when the request's deadline passed first, a wait for one of the process's
    fetches included. Any other cancellation goes on up. The fetch stops
    once its bytes cannot fit in the account's image budget (the budget's
    refusal)."""
    allowance = intake.allowance
    room = None if allowance is None else allowance.room()
    cap = MAX_IMAGE_FETCH_BYTES if room is None else min(room, MAX_IMAGE_FETCH_BYTES)
    if allowance is not None and cap < MAX_IMAGE_FETCH_BYTES:
        allowance.check_open()  # no room at all: refused before connecting
    with anyio.CancelScope(deadline=intake.fetch_by):
        async with intake.fetches:
            try:
                return await fetch_image(url, allow_private=intake.fetch_private, max_bytes=cap)
            except ImageFetchRefused as refused:
                if allowance is not None and refused.reason == "too_large":
                    if cap < MAX_IMAGE_FETCH_BYTES:
                        allowance.refuse_past(cap)
                raise
    return None


def _raise_first_failure(parts: list[_Part], intake: _Intake) -> None:
    """Raise what the first failed part in message order met, whichever
    failed first in time: the answer depends on what failed, not on the
    order the fetches ended in. A part not fetched by the deadline is
    refused with every other such part named."""
    late = [p for p in parts if intake.late and not p.in_hand and not p.failed]
    failed = [p for p in parts if p.failed or (intake.late and not p.in_hand)]
    if not failed:
        return
    first = failed[0]
    if first.error is not None:
        raise first.error
    errors = {
        p.where: p.refusal or _late_reason(p, intake.seconds) for p in failed if p.error is None
    }
    if first.refusal is None:
        message = _late_message(late, intake.seconds)
    else:
        message = f"{first.where}: {first.refusal}"
    raise HordeError(RC.ChatRequestInvalid, message, param=first.where, errors=errors)


def _late_message(late: list[_Part], seconds: float) -> str:
    named = ", ".join(p.where for p in late[:MAX_LATE_IMAGES_NAMED])
    if len(late) > MAX_LATE_IMAGES_NAMED:
        named += f" and {len(late) - MAX_LATE_IMAGES_NAMED} more"
    return f"{named}: not fetched within {seconds:g} s, the time a request's images have in all"


def _late_reason(p: _Part, seconds: float) -> str:
    try:
        host = parse_target(p.url).host
    except ImageFetchRefused:
        host = ""
    why = f"the request's images have {seconds:g} s in all"
    return str(ImageFetchRefused("timeout", host, why))


def _stored(part: dict[str, Any]) -> tuple[str, int] | None:
    """The blob key and JPEG size of a stored image part
    (``hordelite-blob:<key>/<bytes>``), or None for any other part."""
    if part.get("type") != "image_url":
        return None
    url = part.get("image_url", {}).get("url", "")
    if not url.startswith(BLOB_REFERENCE):
        return None
    key, _, size = url[len(BLOB_REFERENCE) :].rpartition("/")
    return key, int(size)


def _inlined_bytes(messages: list[dict[str, Any]]) -> int:
    """The size of the messages' JSON with each stored image inlined as a
    data URL, worked out from the references: no image is read."""
    size = len(json.dumps(messages, ensure_ascii=False, separators=(",", ":")).encode())
    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            stored = _stored(part)
            if stored is not None:
                jpeg = stored[1]
                inlined = len(DATA_URL_PREFIX) + 4 * math.ceil(jpeg / 3)  # base64
                size += inlined - len(part["image_url"]["url"])
    return size


async def _with_images(
    messages: list[dict[str, Any]], store: BlobStore, url_for: Callable[[str], str] | None
) -> list[dict[str, Any]]:
    """The messages with each stored image replaced: by ``url_for(key)``, or
    (None) by the JPEG inline as a data URL, read from the store."""
    handed = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            handed.append(message)
            continue
        parts = []
        for part in content:
            stored = _stored(part)
            if stored is None:
                parts.append(part)
                continue
            key = stored[0]
            if url_for is not None:
                url = url_for(key)
            else:
                blob = await store.get(key)
                # Gone with its request: the worker faults the job.
                url = "" if blob is None else data_url(blob.data)
            parts.append({**part, "image_url": {**part["image_url"], "url": url}})
        handed.append({**message, "content": parts})
    return handed


def messages_key(request_id: str) -> str:
    """The blob key of a request's offloaded messages (purged with its images)."""
    return f"{request_id}-{MESSAGES_KEY_SUFFIX}"


async def _offloaded(
    messages: list[dict[str, Any]], store: BlobStore, request_id: str, offload_bytes: int
) -> str | None:
    """The key of the request's offloaded messages, stored on first need;
    None when the messages, images inlined, are not above ``offload_bytes``."""
    if _inlined_bytes(messages) <= offload_bytes:
        return None  # the usual case: decided without any read
    key = messages_key(request_id)
    if await store.exists(key):  # an earlier pop of the request stored it
        return key
    inlined = await _with_images(messages, store, None)
    body = json.dumps(inlined, ensure_ascii=False, separators=(",", ":")).encode()
    await store.put(key, body, JSON)
    return key


async def hand_images(
    payload: dict[str, Any],
    store: BlobStore,
    worker: WorkerView,
    *,
    request_id: str,
    base_url: str,
    now: float,
    ttl: float,
    offload_bytes: int,
) -> dict[str, Any]:
    """The pop payload as the worker declared it can take it.

    A worker that declared ``messages_url`` gets a request whose messages,
    images inlined as data URLs, exceed ``offload_bytes`` (0: never) as one
    signed URL of that JSON, valid MESSAGES_URL_SECONDS, in place of
    ``messages``. Otherwise each stored image is a signed URL (valid for the
    job's TTL, at least MIN_IMAGE_URL_SECONDS) for a worker that declared
    ``url``, else the JPEG inline as a data URL."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return payload
    if offload_bytes and worker.chat_mask & MESSAGES_URL_BIT:
        key = await _offloaded(messages, store, request_id, offload_bytes)
        if key is not None:
            handed = {k: v for k, v in payload.items() if k != "messages"}
            url = store.signed_url(key, now + MESSAGES_URL_SECONDS, base_url)
            return {**handed, "messages_url": url}
    if worker.chat_mask & IMAGE_TRANSPORT_BITS["url"]:
        expires = now + max(ttl, MIN_IMAGE_URL_SECONDS)
        images = await _with_images(
            messages, store, lambda key: store.signed_url(key, expires, base_url)
        )
    else:
        images = await _with_images(messages, store, None)
    return {**payload, "messages": images}
