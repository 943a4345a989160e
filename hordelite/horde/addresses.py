"""Timeouts and blocks by client address (contract.addresses): the check
every submit and pop makes, the offences that grow automatic timeouts, and
the admins' operations.

The check costs a dictionary look-up or two: each process keeps the rules
in force in memory (``AddressRules``), looks whether they changed (one read
of their version by primary key) at most every ADDRESS_RULES_SECONDS, and
re-reads them only when they did. A change made in this process is seen at
once; one made by another replica within ADDRESS_RULES_SECONDS, on SQLite
and PostgreSQL alike, with no Redis. A lapsed timeout stops applying the
moment it lapses: every check compares with the horde's clock.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import anyio

from hordelite.clock import Clock
from hordelite.contract import refusals
from hordelite.contract._fields import parse_uuid
from hordelite.contract.addresses import (
    Rule,
    RuleSet,
    listed_seconds,
    offence_kind,
    parse_lift_order,
    parse_target,
    parse_timeout_order,
    parse_worker_block,
    refusal,
)
from hordelite.contract.limits import ADDRESS_RULES_SECONDS
from hordelite.horde.keys import hash_key
from hordelite.storage.store import Store

log = logging.getLogger("hordelite.addresses")


class AddressRules:
    """The rules in force, as this process last read them."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._lock = anyio.Lock()
        self._rules = RuleSet()
        self._version = -1
        self._looked_at = -math.inf

    def stale(self) -> None:
        """A change made in this process: the next check looks at once."""
        self._looked_at = -math.inf

    def _fresh(self) -> bool:
        return anyio.current_time() - self._looked_at < ADDRESS_RULES_SECONDS

    async def current(self) -> RuleSet:
        """The rules, looked at again when the last look is too old."""
        if not self._fresh():
            async with self._lock:  # one look for every caller that needs one
                if not self._fresh():
                    version = await self._store.address_version()
                    if version != self._version:
                        version, rules = await self._store.address_rules(now=self._clock.now())
                        self._rules = RuleSet(rules)
                        self._version = version
                    self._looked_at = anyio.current_time()
        return self._rules

    async def check(self, client: str | None, *, worker: bool = False) -> None:
        """Refuse (403 TimeoutIP, saying how long is left) a request or a
        pop (``worker``) from a client a rule covers now."""
        if client is None:
            return
        rules = await self.current()
        if not rules:
            return
        left = rules.left(client, self._clock.now())
        if left > 0:
            raise refusal(left, worker=worker)

    async def offended(self, client: str | None, rc_name: str) -> None:
        """Count a refusal with this return code against ``client`` when it
        is an offence's (a filter's, a budget's); best-effort: the refusal
        is the answer either way."""
        kind = offence_kind(rc_name)
        if client is None or kind is None:
            return
        try:
            given = await self._store.address_offence(
                client=client, kind=kind, now=self._clock.now()
            )
        except Exception as failure:
            log.warning("an offence of %s went uncounted: %s", client, failure)
            return
        if given is not None:
            self.stale()


def _listed(rules: list[Rule], now: float) -> list[dict[str, Any]]:
    """The AI Horde's IPTimeout list (``seconds`` -1: a block)."""
    return [{"ipaddr": r.target, "seconds": listed_seconds(r, now)} for r in rules]


def _worker_id(value: str) -> str:
    """A worker id in its stored form; 404 WorkerNotFound for what is none."""
    canonical = parse_uuid(value)
    if canonical is None:
        raise refusals.unknown_worker(value[:64])
    return canonical


class Addresses:
    """The admins' operations (the /operations/ipaddr routes): each checks
    the key is an admin's in the transaction of its change, which also
    records it in the audit trail, and this process enforces it at once."""

    def __init__(self, rules: AddressRules, store: Store, clock: Clock) -> None:
        self._rules = rules
        self._store = store
        self._clock = clock

    async def listed(self, api_key: str) -> list[dict[str, Any]]:
        """Every timeout and block in force."""
        now = self._clock.now()
        found = await self._store.listed_address_rules(key_hash=hash_key(api_key), now=now)
        return _listed(found, now)

    async def covering(self, api_key: str, ipaddr: str) -> list[dict[str, Any]]:
        """The timeouts and blocks in force that cover ``ipaddr`` (an
        address or a range)."""
        target = parse_target(ipaddr)
        now = self._clock.now()
        found = await self._store.listed_address_rules(key_hash=hash_key(api_key), now=now)
        return _listed(RuleSet(found).covering(target, now), now)

    async def time_out(self, api_key: str, body: Any, client: str | None) -> Rule:
        """POST: time an address or range out, or block it."""
        order = parse_timeout_order(body)
        now = self._clock.now()
        until = None if order.seconds is None else now + order.seconds
        rule = await self._store.set_address_rule(
            key_hash=hash_key(api_key), client=client, target=order.target, until=until, now=now
        )
        self._rules.stale()
        return rule

    async def lift(self, api_key: str, body: Any, client: str | None) -> bool:
        """DELETE: lift an address's or range's timeout or block."""
        target = parse_lift_order(body)
        lifted = await self._store.lift_address_rule(
            key_hash=hash_key(api_key), client=client, target=target, now=self._clock.now()
        )
        self._rules.stale()
        return lifted

    async def block_worker(
        self, api_key: str, worker_id: str, body: Any, client: str | None
    ) -> str:
        """PUT: time out the address a worker last popped from for ``days``."""
        seconds = parse_worker_block(body)
        address = await self._store.block_worker_address(
            key_hash=hash_key(api_key),
            client=client,
            worker_id=_worker_id(worker_id),
            seconds=seconds,
            now=self._clock.now(),
        )
        self._rules.stale()
        return address

    async def unblock_worker(self, api_key: str, worker_id: str, client: str | None) -> str:
        """DELETE: lift the timeout of a worker's address."""
        address = await self._store.unblock_worker_address(
            key_hash=hash_key(api_key),
            client=client,
            worker_id=_worker_id(worker_id),
            now=self._clock.now(),
        )
        self._rules.stale()
        return address
