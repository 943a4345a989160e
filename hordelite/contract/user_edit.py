"""``PUT /users/{id}``: an admin's (or, for its name, a user's own) change
of a user, checked as the AI Horde checks it. Pure: storage applies it.

hordelite keeps a user's name, kudos, concurrency, trust and admin role
(the AI Horde's ``moderator``); the AI Horde's other user fields (contact,
roles such as ``vpn`` or ``education``, ``public_workers``, ...) are not
kept here, and a change of one is refused naming it, never dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hordelite.contract import _fields as f
from hordelite.contract.limits import MAX_CONCURRENCY, MAX_USERNAME
from hordelite.contract.unicode_rules import user_name_refusal
from hordelite.errors import RC, HordeError, bad_request

# The AI Horde's user fields this horde keeps no value of.
NOT_KEPT = (
    "admin_comment",
    "contact",
    "customizer",
    "education",
    "filtered",
    "flagged",
    "monthly_kudos",
    "public_workers",
    "reset_suspicion",
    "service",
    "special",
    "usage_multiplier",
    "vpn",
    "worker_invited",
)
# The largest kudos an admin may add or take in one change.
MAX_KUDOS_CHANGE = 1e12


@dataclasses.dataclass(frozen=True)
class UserEdit:
    """The changes asked for (None: unchanged). ``kudos`` is added to the
    balance (negative takes), as the AI Horde's moderators award."""

    username: str | None = None
    kudos: float | None = None
    concurrency: int | None = None
    trusted: bool | None = None
    moderator: bool | None = None

    @property
    def needs_admin(self) -> bool:
        """Everything but a new name is an admin's change."""
        return any(
            v is not None for v in (self.kudos, self.concurrency, self.trusted, self.moderator)
        )


def username_problem(name: str) -> str | None:
    """Why ``name`` (stripped) cannot be a user's name, or None. Whether
    another user has it already (by key) is storage's to tell."""
    if not name:
        return "must not be empty"
    if len(name) > MAX_USERNAME:
        return f"is at most {MAX_USERNAME} characters"
    if "#" in name:
        return "must not hold '#' (users are shown as name#id)"
    return user_name_refusal(name)


def parse_user_edit(body: Any) -> UserEdit:
    body = f.expect_object(body, "body")
    for key in NOT_KEPT:
        if body.get(key) is not None:
            raise bad_request(key, "this horde keeps no such field of a user")
    username = f.get_str(body, "username", "username", MAX_USERNAME, None)
    if username is not None:
        username = username.strip()
        problem = username_problem(username)
        if problem:
            raise bad_request("username", problem)
    kudos = body.get("kudos")
    if kudos is not None:
        if not f.is_number(kudos):
            raise bad_request("kudos", "expected a number")
        if abs(kudos) > MAX_KUDOS_CHANGE or round(kudos, 2) != kudos:
            raise bad_request("kudos", "at most 10^12 kudos, in whole hundredths")
    edit = UserEdit(
        username=username,
        kudos=None if kudos is None else float(kudos),
        concurrency=f.get_int(body, "concurrency", "concurrency", 0, MAX_CONCURRENCY, None),
        trusted=f.get_bool(body, "trusted", "trusted", None),  # type: ignore[arg-type]
        moderator=f.get_bool(body, "moderator", "moderator", None),  # type: ignore[arg-type]
    )
    if edit == UserEdit():
        raise HordeError(RC.NoValidActions, "No usermod operations selected!")
    return edit
