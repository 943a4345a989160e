"""AWS Signature Version 4 for S3 requests: pure rules, no I/O.

Two forms: ``sign_headers`` adds the ``Authorization`` header (and the
``x-amz-date`` and ``x-amz-content-sha256`` it signs) to a request the store
sends itself; ``presign`` makes a URL anyone can fetch until it expires (the
signature is in its query). Both build the canonical request of the AWS
documentation ("Signature Version 4 signing process"): method, URI-encoded
path, sorted query, sorted lower-case headers, the signed header names and
the payload's SHA-256, then sign it with a key derived from the secret, the
day, the region and the service.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from collections.abc import Mapping
from typing import Final
from urllib.parse import quote

ALGORITHM: Final = "AWS4-HMAC-SHA256"
SERVICE: Final = "s3"
# The longest a presigned URL may live (S3 refuses a longer X-Amz-Expires).
MAX_PRESIGN_SECONDS: Final = 7 * 24 * 3600
# The payload hash of a presigned GET: the fetcher's body is not known.
UNSIGNED_PAYLOAD: Final = "UNSIGNED-PAYLOAD"
EMPTY_SHA256: Final = hashlib.sha256(b"").hexdigest()


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def _encode(value: str, *, slash: bool = False) -> str:
    """URI-encode as SigV4 wants: every byte but A-Z a-z 0-9 - _ . ~ (and
    ``/`` in a path)."""
    return quote(value, safe="-_.~/" if slash else "-_.~")


def amz_date(now: datetime.datetime) -> str:
    """``now`` (UTC) as SigV4's ISO 8601 basic timestamp, ``20130524T000000Z``."""
    return now.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def _scope(date: str, region: str) -> str:
    return f"{date[:8]}/{region}/{SERVICE}/aws4_request"


def signing_key(secret_key: str, date: str, region: str) -> bytes:
    key = _hmac(f"AWS4{secret_key}".encode(), date[:8])
    key = _hmac(key, region)
    key = _hmac(key, SERVICE)
    return _hmac(key, "aws4_request")


def canonical_query(query: Mapping[str, str]) -> str:
    return "&".join(
        f"{_encode(name)}={_encode(value)}"
        for name, value in sorted((str(k), str(v)) for k, v in query.items())
    )


def canonical_request(
    method: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    payload_hash: str,
) -> tuple[str, str]:
    """The canonical request and its signed header names (``host;x-amz-date``)."""
    lowered = sorted((name.lower(), " ".join(value.split())) for name, value in headers.items())
    signed = ";".join(name for name, _ in lowered)
    lines = [
        method,
        _encode(path, slash=True),
        canonical_query(query),
        "".join(f"{name}:{value}\n" for name, value in lowered),
        signed,
        payload_hash,
    ]
    return "\n".join(lines), signed


def signature(secret_key: str, date: str, region: str, canonical: str) -> str:
    """The hex signature of a canonical request made at ``date`` (amz_date)."""
    to_sign = "\n".join(
        [
            ALGORITHM,
            date,
            _scope(date, region),
            hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        ]
    )
    return hmac.new(
        signing_key(secret_key, date, region), to_sign.encode("utf-8"), hashlib.sha256
    ).hexdigest()


def sign_headers(
    *,
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    payload: bytes,
    access_key: str,
    secret_key: str,
    region: str,
    now: datetime.datetime,
) -> dict[str, str]:
    """``headers`` with ``host``, ``x-amz-date``, ``x-amz-content-sha256`` and
    ``Authorization`` added: every header given is signed."""
    date = amz_date(now)
    payload_hash = hashlib.sha256(payload).hexdigest()
    signed_headers = {
        **headers,
        "host": host,
        "x-amz-date": date,
        "x-amz-content-sha256": payload_hash,
    }
    canonical, names = canonical_request(method, path, query, signed_headers, payload_hash)
    sig = signature(secret_key, date, region, canonical)
    return {
        **signed_headers,
        "Authorization": (
            f"{ALGORITHM} Credential={access_key}/{_scope(date, region)}, "
            f"SignedHeaders={names}, Signature={sig}"
        ),
    }


def presign_query(
    *,
    method: str,
    host: str,
    path: str,
    access_key: str,
    secret_key: str,
    region: str,
    now: datetime.datetime,
    expires_in: int,
) -> str:
    """The query string (signature last) presigning ``method`` of ``path`` on
    ``host`` for ``expires_in`` seconds from ``now``."""
    if not 1 <= expires_in <= MAX_PRESIGN_SECONDS:
        raise ValueError(f"a presigned URL lives 1 to {MAX_PRESIGN_SECONDS} seconds")
    date = amz_date(now)
    query = {
        "X-Amz-Algorithm": ALGORITHM,
        "X-Amz-Credential": f"{access_key}/{_scope(date, region)}",
        "X-Amz-Date": date,
        "X-Amz-Expires": str(expires_in),
        "X-Amz-SignedHeaders": "host",
    }
    canonical, _ = canonical_request(method, path, query, {"host": host}, UNSIGNED_PAYLOAD)
    sig = signature(secret_key, date, region, canonical)
    return f"{canonical_query(query)}&X-Amz-Signature={sig}"
