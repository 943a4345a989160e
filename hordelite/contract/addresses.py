"""Timeouts and blocks by client address: the pure rules.

An operator (or the horde itself, for repeated offences) times out an
address or a CIDR range until a moment, or blocks it until lifted. A
request or pop from a covered address is refused with the AI Horde's
``TimeoutIP`` (403), saying how long is left, before anything is stored
or charged.

A target is stored in one canonical form, so that a timeout set as
``2001:db8:1:2::7`` and lifted as ``2001:db8:1:2:ffff::1`` is one target:

- an IPv4 address: itself (``203.0.113.7``);
- an IPv6 address: its /64 (``2001:db8:1:2::/64``), the smallest network an
  ISP hands one subscriber, as the anonymous budgets count a client
  (contract.forwarded, decision 0071); an IPv6 range narrower than /64
  widens to its /64 for the same reason;
- a range: its network (``198.51.100.0/24``), host bits dropped.

The client a request comes from is already in that form
(``forwarded.client_address``), so a client matches a target when it lies in
the target's network: one dictionary look-up per prefix length in use.

Growing timeouts, the AI Horde's way (its ``CounterMeasures.report_suspicion``):
each offence of an address within ``offence_memory`` of its last adds one to
its count, and the n-th offence times it out for (2n - 1) times the first
offence's timeout (3, 9, 15, 21 ... minutes by default), capped. An offence
is a filter's refusal (``CorruptPrompt``), or every
``budget_refusals_per_offence``-th budget refusal (``COUNTED_REFUSALS``): one
budget refusal is an ordinary client's mistake, a run of them a flood.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from collections.abc import Iterable
from typing import Any

from hordelite.contract.budgets import COUNTED_REFUSALS
from hordelite.contract.forwarded import Network
from hordelite.contract.limits import ANONYMOUS_IPV6_PREFIX, MAX_ADDRESS_TARGET_CHARS
from hordelite.errors import RC, HordeError, bad_request

# The return code of a filter's refusal (the AI Horde's), keyed by name: the
# filters define it.
FILTER_OFFENCE = "CorruptPrompt"
# The budget refusals that count toward an offence.
BUDGET_OFFENCES = frozenset(rc.name for rc in COUNTED_REFUSALS)

# An offence's kinds, as stored and documented.
FILTER = "filter"
BUDGET = "budget"

# Past this many seconds left, the refusal says "blocked" rather than a
# count of seconds nobody waits out (the AI Horde's threshold: 4 days).
_SECONDS_SAID = 4 * 86400


def offence_kind(rc_name: str) -> str | None:
    """The kind of offence a refusal with this return code is, None for none."""
    if rc_name == FILTER_OFFENCE:
        return FILTER
    if rc_name in BUDGET_OFFENCES:
        return BUDGET
    return None


def _network(value: str) -> Network:
    if "/" in value:
        network = ipaddress.ip_network(value, strict=False)
    else:
        address = ipaddress.ip_address(value)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        network = ipaddress.ip_network(address)
    if isinstance(network, ipaddress.IPv6Network):
        if network.network_address.ipv4_mapped is not None and network.prefixlen >= 96:
            mapped = network.network_address.ipv4_mapped
            return ipaddress.IPv4Network((mapped, network.prefixlen - 96), strict=False)
        if network.prefixlen > ANONYMOUS_IPV6_PREFIX:
            return network.supernet(new_prefix=ANONYMOUS_IPV6_PREFIX)
    return network


def canonical(network: Network) -> str:
    """A network's stored form: an IPv4 /32 as its address, else the network."""
    if isinstance(network, ipaddress.IPv4Network) and network.prefixlen == 32:
        return str(network.network_address)
    return str(network)


def parse_target(value: Any, field: str = "ipaddr") -> str:
    """An address or CIDR range in its canonical form; 400 BadRequest
    naming ``field`` for anything else."""
    if not isinstance(value, str) or not value.strip():
        raise bad_request(field, "must be an IP address or a CIDR range")
    text = value.strip()
    if len(text) > MAX_ADDRESS_TARGET_CHARS:
        raise bad_request(field, f"is too long: at most {MAX_ADDRESS_TARGET_CHARS} characters")
    try:
        return canonical(_network(text.split("%", 1)[0]))
    except ValueError:
        raise bad_request(field, f"{text[:64]!r} is not an IP address or a CIDR range") from None


def network_of(target: str) -> Network:
    """The network of a canonical target (or of a client as
    ``forwarded.client_address`` gives it)."""
    return _network(target)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A timeout (``until`` a moment) or a block (``until`` None) of a target."""

    target: str
    until: float | None
    created: float = 0.0
    # Set by the horde for repeated offences, not by an operator.
    automatic: bool = False

    def left(self, now: float) -> float:
        """Seconds left at ``now`` (infinite for a block; 0 once lapsed)."""
        return math.inf if self.until is None else max(0.0, self.until - now)


class RuleSet:
    """The rules in force, indexed for a client's look-up: one dictionary
    per family and prefix length in use, so that a check costs a look-up
    per prefix length, not one per rule."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self.rules = tuple(rules)
        self._by_length: dict[tuple[int, int], dict[Network, Rule]] = {}
        for rule in self.rules:
            network = network_of(rule.target)
            key = (network.version, network.prefixlen)
            self._by_length.setdefault(key, {})[network] = rule

    def __len__(self) -> int:
        return len(self.rules)

    def covering(self, client: str, now: float) -> list[Rule]:
        """The rules in force at ``now`` whose network holds ``client`` (an
        address or range in canonical form: a range is held when it lies
        wholly in the rule's network)."""
        if not self._by_length:
            return []
        try:
            network = network_of(client)
        except ValueError:
            return []
        found = []
        for (version, length), rules in self._by_length.items():
            if version != network.version or length > network.prefixlen:
                continue
            rule = rules.get(network.supernet(new_prefix=length))
            if rule is not None and rule.left(now) > 0:
                found.append(rule)
        return found

    def left(self, client: str | None, now: float) -> float:
        """Seconds ``client`` stays refused at ``now``: 0 when no rule covers
        it, infinite under a block, else the longest timeout left."""
        if client is None:
            return 0.0
        return max((rule.left(now) for rule in self.covering(client, now)), default=0.0)


def refusal(left: float, *, worker: bool = False) -> HordeError:
    """The 403 TimeoutIP of a client with ``left`` seconds of timeout to
    go (infinite: blocked), saying how long is left, as the AI Horde's does."""
    who = "your worker's IP address" if worker else "your IP address"
    if left > _SECONDS_SAID:
        message = (
            f"Due to abuse prevention, {who} has been blocked. "
            "Contact this horde's operators if you think this was an error."
        )
        return HordeError(RC.TimeoutIP, message)
    seconds = max(1, math.ceil(left))
    message = (
        f"Due to abuse prevention, {who} has been put into timeout for {seconds} more "
        "seconds. Please try again later, or contact this horde's operators if you think "
        "this was an error."
    )
    return HordeError(RC.TimeoutIP, message, retry_after=seconds)


def offence_timeout(offences: int, first: float, longest: float) -> float:
    """Seconds of timeout the ``offences``-th offence (1 for the first)
    carries: (2n - 1) x ``first``, at most ``longest``."""
    return min(longest, (2 * max(1, offences) - 1) * first)


@dataclasses.dataclass(frozen=True)
class Policy:
    """How offences time an address out ([moderation] ``offence_*`` and
    ``budget_refusals_per_offence``)."""

    # Seconds of the first offence's timeout; the n-th's is (2n - 1) times it.
    first: float = 180.0
    # The longest timeout an offence carries.
    longest: float = 86400.0
    # Seconds after its last offence that an address's offences are forgotten.
    memory: float = 86400.0
    # Budget refusals that make one offence (0: none does).
    refusals_per_offence: int = 10


@dataclasses.dataclass(frozen=True)
class Offences:
    """An address's record: its offences and the budget refusals toward
    the next one, as of its ``last``."""

    offences: int = 0
    refusals: int = 0
    last: float = -math.inf


def after_offence(
    record: Offences, kind: str, now: float, *, memory: float, refusals_per_offence: int
) -> tuple[Offences, bool]:
    """The record after a refusal of ``kind`` at ``now`` and whether it is
    an offence (which times the address out). A record older than
    ``memory`` is forgotten first. ``refusals_per_offence`` 0: budget
    refusals are never offences."""
    if now - record.last > memory:
        record = Offences()
    if kind == FILTER:
        return Offences(record.offences + 1, record.refusals, now), True
    if refusals_per_offence <= 0:
        return record, False
    refusals = record.refusals + 1
    if refusals < refusals_per_offence:
        return Offences(record.offences, refusals, now), False
    return Offences(record.offences + 1, 0, now), True


def listed_seconds(rule: Rule, now: float) -> int:
    """A rule's ``seconds`` as the AI Horde's IPTimeout lists it: whole
    seconds left, -1 for a block (what Redis answers for a key without an
    expiry, which is how the AI Horde keeps one)."""
    if rule.until is None:
        return -1
    return max(0, math.ceil(rule.until - now))


# The AI Horde's bounds: POST /operations/ipaddr takes 1 to 720 hours,
# PUT /operations/block_worker_ipaddr 1 to 30 days.
MAX_HOURS = 24 * 30
MAX_DAYS = 30


@dataclasses.dataclass(frozen=True)
class TimeoutOrder:
    """An admin's POST /operations/ipaddr: ``target`` timed out for
    ``seconds``, or blocked until lifted (``seconds`` None)."""

    target: str
    seconds: float | None


def _whole(body: dict[str, Any], field: str, low: int, high: int) -> int:
    value = body.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(field, f"must be a whole number from {low} to {high}")
    if not low <= value <= high:
        raise bad_request(field, f"must be from {low} to {high}, got {value}")
    return value


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("body", "must be a JSON object")
    return body


def parse_timeout_order(body: Any) -> TimeoutOrder:
    """The AI Horde's ``{"ipaddr", "hours"}``, or hordelite's block
    ``{"ipaddr", "block": true}`` (no hours: until lifted)."""
    body = _object(body)
    target = parse_target(body.get("ipaddr"))
    block = body.get("block", False)
    if not isinstance(block, bool):
        raise bad_request("block", "must be true or false")
    if block:
        return TimeoutOrder(target, None)
    return TimeoutOrder(target, _whole(body, "hours", 1, MAX_HOURS) * 3600.0)


def parse_lift_order(body: Any) -> str:
    """The target of the AI Horde's DELETE ``{"ipaddr"}``."""
    return parse_target(_object(body).get("ipaddr"))


def parse_worker_block(body: Any) -> float:
    """Seconds of the AI Horde's PUT ``{"days"}`` on a worker's address."""
    return _whole(_object(body), "days", 1, MAX_DAYS) * 86400.0
