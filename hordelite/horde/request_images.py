"""Images at submit and at pop: the horde takes them in, workers get them by
their declared transport.

At submit every ``image_url`` part is read (a ``data:`` URL decoded, an
``http(s)`` URL fetched with hordelite.guarded_fetch), checked and normalised
to JPEG (contract/image_normalise.py, in a thread), and stored in the blob store; the
stored request keeps only a reference (``hordelite-blob:<key>/<jpeg bytes>``). At pop,
after the transaction, each reference becomes what the worker declared: a
signed URL for a ``url`` worker, an inline ``data:image/jpeg`` URL for a
``base64``-only one. A large request (``images.offload_bytes``) goes to a
worker that declared ``messages_url`` as one signed URL of its messages,
images inlined, stored at its first such pop.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator
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
    normalise,
    parse_data_url,
)
from hordelite.contract.limits import MESSAGES_URL_SECONDS, MIN_IMAGE_URL_SECONDS
from hordelite.errors import RC, HordeError
from hordelite.guarded_fetch import ImageFetchRefused, fetch_image

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


async def take_images(
    req: ChatRequest,
    store: BlobStore,
    request_id: str,
    *,
    fetch_private: bool,
    limiter: anyio.CapacityLimiter | None = None,
) -> ChatRequest:
    """The request with each image read, checked, normalised to JPEG and
    stored under ``image_keys``; a bad image is refused with 400
    ChatRequestInvalid naming its part (nothing is queued then, and what
    was stored of the request is deleted)."""
    if not req.has_images:
        return req
    # Copies down to the parts, which are replaced below: the caller's
    # request stays as parsed.
    messages = [
        {**m, "content": [{**part} for part in m["content"]]}
        if isinstance(m.get("content"), list)
        else {**m}
        for m in req.messages
    ]
    stored: list[str] = []
    try:
        for n, (where, part) in enumerate(_image_parts(messages)):
            url = part["image_url"]["url"]
            try:
                # Decoding (base64, then the image) and encoding take a while:
                # in a thread, ``limiter`` bounding how many at once, since
                # the threads share the process's core with the event loop.
                if url.startswith("data:"):
                    image = await anyio.to_thread.run_sync(_from_data_url, url, limiter=limiter)
                else:
                    data = await fetch_image(url, allow_private=fetch_private)
                    image = await anyio.to_thread.run_sync(normalise, data, limiter=limiter)
            except (ImageRefused, ImageFetchRefused) as refused:
                raise HordeError(
                    RC.ChatRequestInvalid,
                    f"{where}: {refused}",
                    param=where,
                    errors={where: str(refused)},
                ) from None
            key = f"{request_id}-{n}"
            await store.put(key, image.jpeg, JPEG)
            stored.append(key)
            # The JPEG's size rides along, so that whether a request needs
            # offloading is known at pop without reading its images.
            reference = f"{BLOB_REFERENCE}{key}/{len(image.jpeg)}"
            part["image_url"] = {**part["image_url"], "url": reference}
    except BaseException:
        with anyio.CancelScope(shield=True):
            await store.delete(stored)
        raise
    return dataclasses.replace(req, messages=messages)


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
