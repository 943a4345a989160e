"""The front's readers: each serving process, as the holder of its OpenAI
calls, is their requests' only reader (decision 0051).

Nobody but the call was told a front request's id, so once the call is gone
nobody can read the reply: its request is cancelled and nothing more is
charged for it (``Requests.abandon``). A call that ends without its answer
abandons its request itself; this room covers the process that held the
call dying: a process restarted under the same name takes over what its
predecessor left, and the sweep abandons the requests of a reader whose
lease lapsed (the process never came back).
"""

from __future__ import annotations

import logging
import os
import socket

from hordelite.contract.limits import READER_LEASE_SECONDS
from hordelite.horde._core import HordeCore
from hordelite.horde.requests import Requests

log = logging.getLogger("hordelite")


def reader_name(port: int, slot: int = 0) -> str:
    """The name a serving process reads its calls under: its host, its
    port and its slot among the processes serving that port. A process
    restarted in the same place gets the same name."""
    return f"{socket.gethostname()}:{port}/{slot}"


class Readers:
    """This process's reader lease, and the requests of gone readers."""

    def __init__(self, core: HordeCore, requests: Requests) -> None:
        self._core = core
        self._requests = requests
        # Until a server names it (``take_over``): a horde embedded without
        # one reads under a name of its own process.
        self.name = f"{socket.gethostname()}:embedded/{os.getpid()}"

    async def take_over(self, name: str) -> int:
        """Serve calls under ``name`` from now on; abandon the requests the
        calls of a predecessor under that name left waiting. Answers how
        many."""
        core = self._core
        self.name = name
        left = await core.store.take_over_reader(
            reader=name, expires=core.clock.now() + READER_LEASE_SECONDS
        )
        await self._abandon(left)
        if left:
            log.warning(
                "%d OpenAI call(s) of the process that served before under %s were gone: "
                "their requests were cancelled, uncharged",
                len(left),
                name,
            )
        return len(left)

    async def renew(self) -> None:
        """Renew this process's lease (every READER_RENEW_SECONDS)."""
        core = self._core
        await core.store.hold_reader(
            reader=self.name, expires=core.clock.now() + READER_LEASE_SECONDS
        )

    async def sweep(self) -> int:
        """Abandon the waiting requests of readers whose lease lapsed;
        answers how many."""
        lapsed = await self._core.store.lapsed_reader_requests(
            now=self._core.clock.now(), alive=self.name
        )
        await self._abandon(lapsed)
        if lapsed:
            log.warning(
                "%d OpenAI call(s) of a process that stopped renewing its reader lease were gone: "
                "their requests were cancelled, uncharged",
                len(lapsed),
            )
        return len(lapsed)

    async def _abandon(self, held: list[tuple[str, str]]) -> None:
        for request_id, kind in held:
            # Orphaned: the process that streamed to the call is gone, so its
            # streamed jobs charge nothing, whether or not Redis kept their
            # leases (decision 0073).
            await self._requests.abandon(request_id, kind, orphaned=True)
