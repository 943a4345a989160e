"""Readers: the serving processes holding OpenAI calls, and the waiting
requests of the calls a gone process held (decision 0051).

An OpenAI call is its request's only reader: nobody else was told the
request's id. Each serving process holds a lease on its name (host, port,
process slot), renewed while it serves. A process restarted under its
predecessor's name takes over what the predecessor left waiting; a process
that never comes back lets its lease lapse. Either way the horde cancels
those requests and charges nothing for them (``cancel_request`` with
``unread``).
"""

from __future__ import annotations

from sqlalchemy import bindparam, delete, exists, insert, select, update

from hordelite.storage.schema import readers, requests
from hordelite.storage.transaction import Tx, prepared

_RENEW = prepared(
    update(readers).where(readers.c.id == bindparam("reader")).values(expires=bindparam("e"))
)

# A reader's waiting requests, along the partial index ix_requests_reader
# (the query states its condition, as SQLite needs to use it).
_WAITING = requests.c.reader.is_not(None) & (requests.c.state == "waiting")


def hold_reader(conn: Tx, reader: str, expires: float) -> None:
    """Renew ``reader``'s lease until ``expires`` (taken if it had none)."""
    if conn.execute(_RENEW, {"reader": reader, "e": expires}).rowcount == 0:
        conn.execute(insert(readers).values(id=reader, expires=expires))


def take_over(conn: Tx, reader: str, expires: float) -> list[tuple[str, str]]:
    """Hold ``reader``'s lease for a process starting under that name; the
    waiting requests (id, kind) its predecessor's calls left, which nobody
    can read."""
    hold_reader(conn, reader, expires)
    rows = conn.execute(
        select(requests.c.id, requests.c.kind).where(_WAITING, requests.c.reader == reader)
    )
    return [(r.id, r.kind) for r in rows]


def lapsed_requests(conn: Tx, now: float, alive: str) -> list[tuple[str, str]]:
    """The waiting requests (id, kind) of readers whose lease lapsed before ``now``, but
    for ``alive`` (the process asking: its calls are served, whatever its
    lease says); the lapsed readers that hold none are forgotten."""
    gone = (readers.c.expires < now) & (readers.c.id != alive)
    found = [
        (r.id, r.kind)
        for r in conn.execute(
            select(requests.c.id, requests.c.kind)
            .join(readers, readers.c.id == requests.c.reader)
            .where(_WAITING, gone)
        )
    ]
    if not found:
        held = exists().where(_WAITING, requests.c.reader == readers.c.id)
        conn.execute(delete(readers).where(gone, ~held))
    return found
