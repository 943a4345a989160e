"""A chat job's images, handed to the backend inline.

The horde gives a vision worker each image as a signed URL of its blob
route (``url`` transport) or as a ``data:`` URL (``base64``). A backend is
not trusted to fetch URLs (llama.cpp's server does not, and none should
reach the horde's blobs itself), so the worker fetches each URL, with a byte
cap and a timeout, and sends the backend a data URL whose media type it
takes from the bytes; a ``data:`` URL goes as it came.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncGenerator, Mapping
from typing import Any, cast

import anyio
import httpx

from hordelite.contract.limits import MAX_WORKER_IMAGE_BYTES, WORKER_IMAGE_FETCH_TIMEOUT
from hordelite.errors import HordeliteError
from hordelite.worker._transport import Transport

# The formats a backend reads, by their first bytes (WebP: RIFF....WEBP).
_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"WEBP", 8, "image/webp"),
)


class ImageUnavailable(HordeliteError):
    """An image of the job could not be fetched: an HTTP error, over the
    byte cap, a timeout, or bytes of no image format. The horde's link, not
    the request, failed, so the job is faulted without a reason."""


def media_type(data: bytes) -> str | None:
    """The image format of ``data`` by its magic number, None for another."""
    for magic, offset, kind in _MAGIC:
        if data[offset : offset + len(magic)] == magic:
            if kind == "image/webp" and not data.startswith(b"RIFF"):
                continue
            return kind
    return None


def has_images(body: Mapping[str, Any]) -> bool:
    return any(True for _ in _image_parts(body))


def _image_parts(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        part
        for message in body.get("messages") or ()
        if isinstance(message, Mapping) and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image_url"
    ]


class ImageFetcher:
    """Fetches the signed URLs of jobs' images (one client for the worker)."""

    def __init__(
        self,
        max_bytes: int = MAX_WORKER_IMAGE_BYTES,
        timeout: float = WORKER_IMAGE_FETCH_TIMEOUT,
    ) -> None:
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.client = httpx.AsyncClient(timeout=timeout, transport=Transport())

    async def aclose(self) -> None:
        await self.client.aclose()

    async def inline(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``body`` with every image part's http(s) URL replaced by a data
        URL of the fetched bytes; raises ImageUnavailable. The parts are
        copied: the job's payload keeps its URLs."""
        messages = []
        for message in body.get("messages") or ():
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, list):
                message = {**message, "content": [await self._part(p) for p in content]}
            messages.append(message)
        return {**body, "messages": messages}

    async def _part(self, part: Any) -> Any:
        if not (isinstance(part, Mapping) and part.get("type") == "image_url"):
            return part
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else None
        if not isinstance(image, Mapping) or not isinstance(url, str) or url.startswith("data:"):
            return part  # inline already (or not an image the worker can fetch)
        if not url.startswith(("http://", "https://")):
            raise ImageUnavailable(f"an image URL the worker cannot fetch: {url[:80]!r}")
        data = await self.fetch(url)
        kind = media_type(data)
        if kind is None:
            raise ImageUnavailable(f"{_shown(url)} is not a JPEG, PNG, WebP or GIF image")
        encoded = base64.b64encode(data).decode("ascii")
        return {**part, "image_url": {**image, "url": f"data:{kind};base64,{encoded}"}}

    async def fetch(self, url: str) -> bytes:
        """The bytes at ``url`` (a 2xx answer, at most ``max_bytes``, all
        within ``timeout`` seconds); raises ImageUnavailable."""
        shown = _shown(url)
        try:
            with anyio.fail_after(self.timeout):
                async with self.client.stream("GET", url) as response:
                    if not response.is_success:
                        raise ImageUnavailable(f"{shown}: HTTP {response.status_code}")
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > self.max_bytes:
                        raise ImageUnavailable(f"{shown}: {declared} bytes, over the cap")
                    chunks = bytearray()
                    # Closed here when the cap stops the reading, not left
                    # half iterated to the garbage collector (trio reports it).
                    body = cast(AsyncGenerator[bytes, None], response.aiter_bytes())
                    async with contextlib.aclosing(body):
                        async for chunk in body:
                            chunks += chunk
                            if len(chunks) > self.max_bytes:
                                raise ImageUnavailable(
                                    f"{shown}: more than {self.max_bytes} bytes, over the cap"
                                )
                    return bytes(chunks)
        except TimeoutError:
            raise ImageUnavailable(f"{shown}: not fetched within {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise ImageUnavailable(f"{shown}: {exc!r}") from exc


def _shown(url: str) -> str:
    """The URL without its query (the signature is not for the log)."""
    return url.split("?", 1)[0]
