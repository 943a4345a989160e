"""What a Request reads of its headers: Accept-Encoding by quality, and
whether a body is declared (hordelite/http/request.py)."""

from __future__ import annotations

import pytest

from hordelite.config import Config
from hordelite.http.request import Request, Settings, header


def _request(*headers: tuple[str, str]) -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
    }
    return Request(scope, _no_body, Settings.of(Config().server), {})


async def _no_body() -> dict[str, object]:
    raise AssertionError("the body is not read here")


@pytest.mark.parametrize(
    ("accept_encoding", "gzip"),
    [
        (None, False),
        ("gzip", True),
        ("br, GZIP;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0, identity", False),
        ("*", True),
        ("*;q=0", False),
        ("identity", False),
        ("gzip;q=bad", False),
    ],
)
def test_accepts_reads_a_coding_by_name_or_star_at_a_quality_above_zero(
    accept_encoding: str | None, gzip: bool
) -> None:
    headers = [] if accept_encoding is None else [("Accept-Encoding", accept_encoding)]
    assert _request(*headers).accepts("gzip") is gzip


@pytest.mark.parametrize(
    ("headers", "declared"),
    [
        ((), False),
        ((("Content-Length", "0"),), False),
        ((("Content-Length", " 0 "),), False),
        ((("Content-Length", "12"),), True),
        ((("Transfer-Encoding", "chunked"),), True),
    ],
)
def test_a_body_is_declared_by_a_length_other_than_0_or_a_transfer_encoding(
    headers: tuple[tuple[str, str], ...], declared: bool
) -> None:
    assert _request(*headers).declares_body() is declared


def test_headers_are_matched_case_blind_and_the_first_value_wins() -> None:
    request = _request(("X-Forwarded-For", "10.0.0.1"), ("x-forwarded-for", "10.0.0.2"))
    assert header(request.scope, "X-FORWARDED-FOR") == "10.0.0.1"
    assert request.joined("x-forwarded-for") == "10.0.0.1, 10.0.0.2"
    assert request.header("origin") is None
