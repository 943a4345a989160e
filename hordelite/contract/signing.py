"""Blob keys and the signed, expiring URLs that hand blobs to workers.

A blob (an image, an offloaded chat request) is fetched at
``{base_url}/blobs/{key}?expires={int}&sig={hex}``. ``sig`` is an
HMAC-SHA256, under the store's secret, of the path and the expiry: the base
URL is not signed, so the horde may be reached under another name (a proxy)
than the one it signed with. Pure rules only: the secret is read and kept by
the store (hordelite.blobs).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final
from urllib.parse import urlencode

from hordelite.errors import HordeliteError

# The route the blobs are served on (hordelite.api.blobs).
BLOB_ROUTE: Final = "/blobs"
# Bytes of the signing secret (secrets.token_bytes): SHA-256's block input
# needs no more, and fewer would weaken the HMAC.
SECRET_BYTES: Final = 32
MAX_KEY_CHARS: Final = 128
# A key is also a file name: no separator, no dot (so never ``..`` nor a
# hidden or temporary file of the store), nothing a URL would escape.
_KEY = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_KEY_CHARS}}}")
# An expiry as signed: seconds since the epoch, canonical (no sign, no
# leading zero, no digit separators int() would accept).
_EXPIRES = re.compile(r"0|[1-9][0-9]{0,11}")
_SIG = re.compile(r"[0-9a-f]{64}")
MAX_CONTENT_TYPE_CHARS: Final = 255
_CONTENT_TYPE = re.compile(r"[\x21-\x7e]+(?:[ \t]*;[ \t]*[\x21-\x7e]+)*")


class BlobKeyError(HordeliteError, ValueError):
    """A key outside the safe alphabet; the store refuses it before any I/O."""


def check_key(key: str) -> str:
    """``key`` when it is safe as a file name and a URL segment, else BlobKeyError."""
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise BlobKeyError(
            f"blob key {key!r} must be 1 to {MAX_KEY_CHARS} characters of A-Z, a-z, 0-9, _ and -"
        )
    return key


def is_key(key: str) -> bool:
    """Whether ``key`` passes check_key."""
    return isinstance(key, str) and _KEY.fullmatch(key) is not None


def check_content_type(content_type: str) -> str:
    """``content_type`` when it is one printable ASCII line (it is stored as one)."""
    if (
        not isinstance(content_type, str)
        or len(content_type) > MAX_CONTENT_TYPE_CHARS
        or _CONTENT_TYPE.fullmatch(content_type) is None
    ):
        raise ValueError(f"content type {content_type!r} is not a printable ASCII media type")
    return content_type


def _message(key: str, expires: int) -> bytes:
    return f"{BLOB_ROUTE}/{key}\n{expires}".encode("ascii")


def signature(secret: bytes, key: str, expires: int) -> str:
    """The hex HMAC-SHA256 of the blob's path and its expiry."""
    return hmac.new(secret, _message(check_key(key), expires), hashlib.sha256).hexdigest()


def signed_url(secret: bytes, key: str, expires_at: float, base_url: str) -> str:
    """The URL serving ``key`` until ``expires_at`` (rounded down to a second)."""
    expires = int(expires_at)
    query = urlencode({"expires": expires, "sig": signature(secret, key, expires)})
    return f"{base_url.rstrip('/')}{BLOB_ROUTE}/{check_key(key)}?{query}"


def refusal(secret: bytes, key: str, expires: str, sig: str, now: float) -> str | None:
    """Why a fetch of ``key`` with these query values is refused, or None.

    Every value comes from the client: each is checked for its shape before
    the HMAC, and the signatures are compared in constant time.
    """
    if (
        _KEY.fullmatch(key) is None
        or _EXPIRES.fullmatch(expires) is None
        or _SIG.fullmatch(sig) is None
    ):
        return "This blob URL is malformed."
    if not hmac.compare_digest(sig, signature(secret, key, int(expires))):
        return "This blob URL's signature does not match."
    # Checked after the signature, so an expiry is only reported for a URL
    # the horde really signed.
    if now >= int(expires):
        return "This blob URL has expired."
    return None


def verify(secret: bytes, key: str, expires: str, sig: str, now: float) -> bool:
    """The URL is the horde's, for this key, and not yet expired."""
    return refusal(secret, key, expires, sig, now) is None
