"""The dependencies whose private names hordelite uses, the versions it is
tested with, and a check of the installed ones (decision 0074).

A private name (an underscored method, an internal module, a class meant
only for the library itself) can change in any release, a patch release
too, with no deprecation. So each dependency whose private names are used
is held to the range of versions hordelite was tested with, in
``pyproject.toml`` (pip then installs nothing else), and ``PINS`` below
lists each such name: where hordelite uses it and why no public API does
the same work. ``tests/unit/test_pinned.py`` holds the two lists of ranges
equal, and ``constraints.txt`` (the lock) inside them.

pip already refuses a version outside a range. ``untested`` catches what
gets past pip: a version forced after the install (``pip install
hypercorn==0.17.3``, ``--no-deps``), or one a distribution's package manager
supplies. ``hordelite serve`` logs each line it returns as a warning and
serves all the same: the version may well work, and the warning says where
to look when it does not.

Every other dependency is used through its public API only (anyio, trio,
Quart, Quart-Trio, Werkzeug, httpx, greenlet, jsonschema, Pillow,
prometheus-client): ``pyproject.toml`` gives those a lower bound alone.

To move a range (an upgrade): change it here and in ``pyproject.toml``
together, run the tests of the modules each row names (and the whole
suite), check every row still holds, then regenerate ``constraints.txt``
(see its header).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from collections.abc import Callable
from typing import Final


@dataclasses.dataclass(frozen=True)
class PrivateUse:
    """One private name of a dependency that hordelite uses."""

    name: str  # the name, as the dependency spells it
    where: str  # the hordelite module (and class or function) using it
    why: str  # what it does there that no public API does


@dataclasses.dataclass(frozen=True)
class Pin:
    """A dependency held to the range hordelite is tested with."""

    distribution: str  # its name on PyPI, as in pyproject.toml
    tested: str  # the range, ">=LOWEST,<BELOW", as in pyproject.toml
    uses: tuple[PrivateUse, ...]


_HTTP = "hordelite/http"
_STORAGE = "hordelite/storage"

PINS: Final[tuple[Pin, ...]] = (
    Pin(
        "hypercorn",
        ">=0.18,<0.19",
        (
            PrivateUse(
                "hypercorn.protocol.H11Protocol and .H2Protocol, replaced at import",
                f"{_HTTP}/wire.py: install",
                "ProtocolWrapper builds each connection's protocol by these two "
                "names, on trio and asyncio alike: the only place the strict wire "
                "and the HTTP/2 mend can go in (decision 0050)",
            ),
            PrivateUse(
                "H11Protocol._check_protocol (overridden), .connection (replaced)",
                f"{_HTTP}/wire.py: StrictH11Protocol",
                "the h11 connection is the strict one; h2c is served only with server.h2c",
            ),
            PrivateUse(
                "H11Protocol._send_error_response (overridden), .send(RawData(...))",
                f"{_HTTP}/wire.py: StrictH11Protocol",
                "a refusal of the wire is answered in the horde's error envelope, "
                "in one write",
            ),
            PrivateUse(
                "H2Protocol.send_task, .stream_send (overridden); .stream_buffers, "
                ".streams, ._close_stream, ._flush, .context.terminated; "
                "hypercorn.protocol.events.StreamClosed, hypercorn.events.Closed",
                f"{_HTTP}/wire.py: ClosingH2Protocol",
                "an HTTP/2 client leaving mid-answer no longer holds the server, "
                "nor does a stream's end on a stopping server",
            ),
            PrivateUse(
                "hypercorn.trio.task_group.TaskGroup (subclassed: spawn_app, "
                "._nursery) and ._handle",
                f"{_HTTP}/connection.py: _AppTasks",
                "each exchange gets an Inbox, which says when its client left, in "
                "place of a memory channel and a task watching it",
            ),
            PrivateUse(
                "hypercorn.trio.tcp_server.TCPServer (subclassed: run, ._read_data; "
                "._task_group, .idle_task, ._idle_timeout, ._close, .protocol_send, "
                "MAX_RECV), hypercorn.utils.parse_socket_addr",
                f"{_HTTP}/connection.py: Connection",
                "a connection reads its socket directly: less held per open "
                "connection while a long-poll or an OpenAI call waits",
            ),
            PrivateUse(
                "hypercorn.trio.run.worker_serve, re-implemented from "
                "hypercorn.trio.lifespan.Lifespan, hypercorn.trio.worker_context."
                "WorkerContext (.terminated) and hypercorn.typing.ConnectionState",
                f"{_HTTP}/server.py: _serve_trio",
                "an accept loop taking every waiting connection at once, and the "
                "Connection above; the public serve() takes neither",
            ),
            PrivateUse(
                "hypercorn.asyncio.run.worker_serve (its sockets argument, and the "
                "InvalidStateError it raises when cancelled); hypercorn.utils.wrap_app",
                f"{_HTTP}/server.py: serve_http",
                "serves a socket already listening (shared by --processes); the "
                "public serve() binds its own",
            ),
            PrivateUse(
                "Config.create_sockets, and Config.workers > 1 meaning SO_REUSEPORT",
                f"{_HTTP}/server.py: listen, claim_port",
                "the server's sockets bound as Hypercorn binds them, shared "
                "between processes",
            ),
        ),
    ),
    Pin(
        "h11",
        ">=0.16,<0.17",
        (
            PrivateUse(
                "Connection._receive_buffer._data",
                f"{_HTTP}/wire.py: StrictConnection",
                "a request head is checked in place before h11 parses it; the "
                "public trailing_data copies the whole buffer at every read",
            ),
            PrivateUse(
                "Connection._reader; h11._readers.ChunkedReader and its "
                "._reading_trailer, ._bytes_in_chunk, ._bytes_to_discard",
                f"{_HTTP}/wire.py: StrictConnection._check_chunk_size",
                "a chunk size past server.max_body_bytes is refused as its digits "
                "arrive, before h11 waits for that many bytes",
            ),
            PrivateUse(
                "Connection._process_error",
                f"{_HTTP}/wire.py: StrictConnection.next_event",
                "after a refusal of the wire h11 is in ERROR, as after its own, so "
                "Hypercorn drops the app's later sends",
            ),
        ),
    ),
    Pin(
        "sqlalchemy",
        ">=2.1.9,<2.2",
        (
            PrivateUse(
                "Connection._has_events, Engine._has_events, "
                "Connection.dispatch.before_cursor_execute",
                f"{_STORAGE}/transaction.py: Tx._heard",
                "statements on the fast path reach before_cursor_execute listeners "
                "(the tests that count statements); no public API fires an event",
            ),
            PrivateUse(
                "SQLCompiler._result_columns",
                f"{_STORAGE}/transaction.py: _make_plan",
                "a result's column names, as SQLAlchemy names a Row's, and their "
                "types, in order, from the compiled statement",
            ),
            PrivateUse(
                "SQLCompiler._within_exec_param_key_getter",
                f"{_STORAGE}/transaction.py: _prefetched_defaults",
                "the parameter name a column's Python-side default fills in",
            ),
            PrivateUse(
                "SQLCompiler's attributes documented under Core internals: "
                "bind_names, positiontup, post_compile_params, literal_execute_params, "
                "escaped_bind_names, for_executemany, insert_prefetch, update_prefetch",
                f"{_STORAGE}/transaction.py: _make_plan, _needs_sqlalchemy, _binds",
                "a prepared statement's SQL, parameter order and defaults, read "
                "once, then run on the driver",
            ),
            PrivateUse(
                "a copy of the engine's Dialect with paramstyle, positional and "
                "identifier_preparer set",
                f"{_STORAGE}/transaction.py: _compiling_dialect",
                "plans compiled with $n parameters, which libpq takes as they are; "
                "a new dialect would lack what the engine's learnt from the server",
            ),
        ),
    ),
    Pin(
        "psycopg",
        ">=3.3.9,<3.4",
        (
            PrivateUse(
                "Connection.wait (overridden; its timeout keyword read)",
                f"{_STORAGE}/_on_loop.py: LoopConnection",
                "every socket wait of the synchronous connection is awaited on the "
                "event loop, from a greenlet (decision 0059)",
            ),
            PrivateUse(
                "psycopg.waiting: WAIT_R, WAIT_W, WAIT_RW, READY_R, READY_W",
                f"{_STORAGE}/_on_loop.py, {_STORAGE}/_libpq.py",
                "what psycopg's I/O generators yield and are sent back",
            ),
            PrivateUse(
                "psycopg.adapt.Transformer (dump_sequence, types, formats, "
                "set_pgresult, load_rows), the machinery under its cursors",
                f"{_STORAGE}/_libpq.py: Statements",
                "one transformer per connection dumps parameters and loads rows "
                "of the plans sent straight to libpq (decision 0068)",
            ),
        ),
    ),
)


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``; None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def untested(
    version_of: Callable[[str], str | None] = installed_version,
) -> list[str]:
    """One line per pinned dependency installed outside its tested range (or
    not installed), naming it, the installed version and the range; empty
    when every one is inside. ``version_of`` reads a distribution's version."""
    lines = []
    for pin in PINS:
        version = version_of(pin.distribution)
        if version is None:
            lines.append(
                f"{pin.distribution} is not installed; hordelite is tested with "
                f"{pin.distribution}{pin.tested}"
            )
        elif not inside(version, pin.tested):
            lines.append(
                f"{pin.distribution} {version} is installed, outside the range hordelite "
                f"is tested with ({pin.distribution}{pin.tested}): hordelite uses its "
                "private names (hordelite/pinned.py lists them)"
            )
    return lines


def warn_untested(log: Callable[[str], object]) -> None:
    """``log`` each line of ``untested()`` (at start: hordelite serves anyway)."""
    for line in untested():
        log(line)


_RANGE = re.compile(r">=(\d+(?:\.\d+)*),<(\d+(?:\.\d+)*)")
# A release's numbers, then whether a pre-release or development marker
# follows (PEP 440 spellings: 1.0rc1, 1.0-rc.1, 1.0.dev2, 1.0a1).
_VERSION = re.compile(r"(\d+(?:\.\d+)*)([._-]?(?:a|b|c|rc|alpha|beta|pre|preview|dev))?", re.I)


def inside(version: str, tested: str) -> bool:
    """Whether ``version`` lies in ``tested`` (">=LOWEST,<BELOW"), as pip
    reads it: a pre-release of LOWEST is below it, and one of BELOW is not
    inside. A version it cannot read is outside."""
    bounds = _RANGE.fullmatch(tested)
    found = _VERSION.match(version.strip())
    if bounds is None or found is None:
        return False
    release = _release(found.group(1))
    pre = bool(found.group(2))
    lowest, below = _release(bounds.group(1)), _release(bounds.group(2))
    at_least = release > lowest or (release == lowest and not pre)
    return at_least and release < below


def _release(text: str) -> tuple[int, ...]:
    """A release's numbers, trailing zeros dropped (0.18.0 compares as 0.18)."""
    numbers = [int(n) for n in text.split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)
