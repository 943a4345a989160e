"""Images at submit and at pop: the horde takes them in, workers get them by
their declared transport.

At submit every ``image_url`` part is read (a ``data:`` URL decoded, an
``http(s)`` URL fetched with hordelite.images.fetch), checked and normalised
to JPEG (contract/images.py, in a thread), and stored in the blob store; the
stored request keeps only a reference (``hordelite-blob:<key>``). At pop,
after the transaction, each reference becomes what the worker declared: a
signed URL for a ``url`` worker, an inline ``data:image/jpeg`` URL for a
``base64``-only one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import anyio.to_thread

from hordelite.blobs import BlobStore
from hordelite.contract.chat_features import IMAGE_TRANSPORT_BITS
from hordelite.contract.chat_request import BLOB_REFERENCE, ChatRequest
from hordelite.contract.eligibility import WorkerView
from hordelite.contract.images import ImageRefused, data_url, normalise, parse_data_url
from hordelite.contract.limits import MIN_IMAGE_URL_SECONDS
from hordelite.errors import RC, HordeError
from hordelite.images.fetch import ImageFetchRefused, fetch_image

JPEG = "image/jpeg"


def _image_parts(messages: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each image part with the path a refusal names."""
    for i, message in enumerate(messages):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if part.get("type") == "image_url":
                yield f"messages[{i}].content[{j}].image_url", part


def image_keys(request_id: str, req: ChatRequest) -> list[str]:
    """The blob keys the request's images are stored under."""
    return [f"{request_id}-{n}" for n, _ in enumerate(_image_parts(req.messages))]


async def take_images(
    req: ChatRequest, store: BlobStore, request_id: str, *, fetch_private: bool
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
                if url.startswith("data:"):
                    data = parse_data_url(url)
                else:
                    data = await fetch_image(url, allow_private=fetch_private)
                # Decoding and encoding a large image takes a while: off the loop.
                image = await anyio.to_thread.run_sync(normalise, data)
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
            part["image_url"] = {**part["image_url"], "url": BLOB_REFERENCE + key}
    except BaseException:
        with anyio.CancelScope(shield=True):
            await store.delete(stored)
        raise
    return dataclasses.replace(req, messages=messages)


async def hand_images(
    payload: dict[str, Any],
    store: BlobStore,
    worker: WorkerView,
    *,
    base_url: str,
    now: float,
    ttl: float,
) -> dict[str, Any]:
    """The pop payload with each stored image in the worker's transport: a
    signed URL (valid for the job's TTL, at least MIN_IMAGE_URL_SECONDS) for
    a worker that declared ``url``, else the JPEG inline as a data URL."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return payload
    by_url = bool(worker.chat_mask & IMAGE_TRANSPORT_BITS["url"])
    expires = now + max(ttl, MIN_IMAGE_URL_SECONDS)
    handed = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            handed.append(message)
            continue
        parts = []
        for part in content:
            url = (
                part.get("image_url", {}).get("url", "") if part.get("type") == "image_url" else ""
            )
            if not url.startswith(BLOB_REFERENCE):
                parts.append(part)
                continue
            key = url[len(BLOB_REFERENCE) :]
            if by_url:
                url = store.signed_url(key, expires, base_url)
            else:
                blob = await store.get(key)
                if blob is None:  # gone with its request: the worker faults the job
                    url = ""
                else:
                    url = data_url(blob.data)
            parts.append({**part, "image_url": {**part["image_url"], "url": url}})
        handed.append({**message, "content": parts})
    return {**payload, "messages": handed}
