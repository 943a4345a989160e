"""``hordelite addresses``: the operator's timeouts and blocks by address
or range at the shell (docs/reference/addresses.md), each recorded in the
audit trail as ``cli``. Running hordes enforce a change within
ADDRESS_RULES_SECONDS: they poll the rules' version."""

from __future__ import annotations

import math
import time

from hordelite.cli._admin import Refused, Target, _table, run
from hordelite.config import Config
from hordelite.contract.addresses import MAX_HOURS, Rule, parse_target
from hordelite.errors import HordeError


def _target(value: str) -> str:
    try:
        return parse_target(value, "ADDRESS")
    except HordeError as exc:
        raise Refused(exc.message) from None


def _left(rule: Rule, now: float) -> str:
    if rule.until is None:
        return "blocked"
    seconds = math.ceil(rule.until - now)
    if seconds < 3600:
        return f"{seconds} s"
    return f"{seconds / 3600:.1f} h"


def addresses_list(config: Config, where: Target) -> list[str]:
    now = time.time()
    rules = run(config, where, lambda store: store.address_rules_sync(now=now))
    if not rules:
        return [f"database: {where.shown}", "no address is timed out or blocked"]
    rows = [(r.target, _left(r, now), "horde" if r.automatic else "operator") for r in rules]
    return [f"database: {where.shown}", *_table(("ADDRESS", "LEFT", "BY"), rows)]


def addresses_timeout(config: Config, where: Target, address: str, hours: float) -> list[str]:
    target = _target(address)
    if not (math.isfinite(hours) and 0 < hours <= MAX_HOURS):
        raise Refused(f"--hours: expected more than 0 and at most {MAX_HOURS}, got {hours:g}")
    now = time.time()
    run(
        config,
        where,
        lambda store: store.set_address_rule_sync(target=target, until=now + hours * 3600, now=now),
    )
    return [f"database: {where.shown}", f"{target} timed out for {hours:g} h."]


def addresses_block(config: Config, where: Target, address: str) -> list[str]:
    target = _target(address)
    now = time.time()
    run(
        config, where, lambda store: store.set_address_rule_sync(target=target, until=None, now=now)
    )
    return [f"database: {where.shown}", f"{target} blocked until lifted."]


def addresses_lift(config: Config, where: Target, address: str) -> list[str]:
    target = _target(address)
    now = time.time()
    found = run(config, where, lambda store: store.lift_address_rule_sync(target=target, now=now))
    said = "lifted" if found else "had no timeout or block"
    return [f"database: {where.shown}", f"{target} {said}."]
