"""AWS Signature Version 4 (hordelite.contract.sigv4) against the examples
AWS publishes in "Authenticating Requests (AWS Signature Version 4)" of the
Amazon S3 API reference: the same credentials, time and request must give
the signatures printed there."""

from __future__ import annotations

import datetime
from typing import Any
from urllib.parse import parse_qsl

import pytest

from hordelite.blobs import _sigv4 as sigv4

ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HOST = "examplebucket.s3.amazonaws.com"
NOW = datetime.datetime(2013, 5, 24, tzinfo=datetime.UTC)


def presign(**changes: Any) -> str:
    """The documented presigned GET (expiring in 60 s), with ``changes``."""
    request: dict[str, Any] = {
        "method": "GET",
        "host": HOST,
        "path": "/test.txt",
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region": "us-east-1",
        "now": NOW,
        "expires_in": 60,
    }
    return sigv4.presign_query(**{**request, **changes})


def test_the_documented_presigned_get_example() -> None:
    query = presign(expires_in=86400)
    assert query == (
        "X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    )


def test_the_documented_get_object_example_signed_in_headers() -> None:
    headers = sigv4.sign_headers(
        method="GET",
        host=HOST,
        path="/test.txt",
        query={},
        headers={"Range": "bytes=0-9"},
        payload=b"",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        region="us-east-1",
        now=NOW,
    )
    assert headers["x-amz-date"] == "20130524T000000Z"
    assert headers["x-amz-content-sha256"] == sigv4.EMPTY_SHA256
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


def test_the_canonical_query_is_sorted_and_encoded_as_sigv4_wants() -> None:
    # Spaces as %20 (never +), '/' and '=' encoded in a value, '~' kept.
    assert sigv4.canonical_query({"prefix": "a b/c=~", "list-type": "2"}) == (
        "list-type=2&prefix=a%20b%2Fc%3D~"
    )


def test_every_signed_part_changes_the_signature() -> None:
    def sign(**changes: Any) -> str:
        return dict(parse_qsl(presign(**changes)))["X-Amz-Signature"]

    base = sign()
    others = [
        sign(method="PUT"),
        sign(host="other.example"),
        sign(path="/other.txt"),
        sign(access_key="AKIAIOSFODNN7EXAMPLF"),  # in the signed credential
        sign(secret_key="x" + SECRET_KEY[1:]),
        sign(region="eu-west-1"),
        sign(now=NOW + datetime.timedelta(seconds=1)),
        sign(expires_in=61),
    ]
    assert base not in others
    assert len(set(others)) == len(others)


@pytest.mark.parametrize("seconds", [0, -1, sigv4.MAX_PRESIGN_SECONDS + 1])
def test_a_presigned_url_lives_one_second_to_seven_days(seconds: int) -> None:
    with pytest.raises(ValueError, match="1 to 604800 seconds"):
        presign(expires_in=seconds)
