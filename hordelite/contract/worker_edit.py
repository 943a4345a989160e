"""A worker's owner's (or an admin's) change to it: ``PUT /workers/{id}``,
checked field by field as the AI Horde takes it. Pure: storage applies it.

Each field the AI Horde's ModifyWorker knows is applied or refused by name,
never dropped: ``maintenance``, ``info``, ``name``, ``paused`` and
``reset_suspicion`` (an admin's, as the AI Horde's moderators'), ``team`` (no teams here: only ``""``, no
team, is taken, decision 0055), and hordelite's ``online: false``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hordelite.contract._fields import expect_object, get_bool, get_str
from hordelite.contract.limits import MAX_NAME, MAX_WORKER_INFO
from hordelite.contract.unicode_rules import worker_name_key
from hordelite.errors import RC, HordeError, bad_request


@dataclasses.dataclass(frozen=True)
class WorkerEdit:
    """The changes asked for; None: left as it is. ``info`` "" clears it."""

    maintenance: bool | None = None
    info: str | None = None
    name: str | None = None
    name_key: str | None = None
    paused: bool | None = None
    team: str | None = None  # only "" (no team) gets here
    offline: bool = False
    # The AI Horde's reset_suspicion (contract.suspicion): the count back
    # to 0 and the pause lifted, unless ``paused`` is set too.
    reset_suspicion: bool = False

    @property
    def admin_only(self) -> bool:
        """Only an admin may pause or unpause a worker, or reset its suspicion."""
        return self.paused is not None or self.reset_suspicion


def parse_worker_edit(body: Any) -> WorkerEdit:
    """The edit of a PUT body; 400 naming the field for a bad value, 400
    NoWorkerModSelected when it asks for nothing (as on the AI Horde)."""
    body = expect_object(body, "body")
    if body.get("maintenance_msg") is not None:
        raise bad_request("maintenance_msg", "this horde keeps no maintenance message")
    maintenance = _flag(body, "maintenance")
    paused = _flag(body, "paused")
    reset_suspicion = _flag(body, "reset_suspicion")
    info = get_str(body, "info", "info", MAX_WORKER_INFO, None)
    name = get_str(body, "name", "name", MAX_NAME, None)
    name_key = None if name is None else worker_name_key(name, "name")
    team = get_str(body, "team", "team", MAX_NAME, None)
    if team:
        raise HordeError(
            RC.TeamNotFound,
            f"team: no team {team[:64]!r}: this horde keeps no teams",
            errors={"team": 'this horde keeps no teams; only "" (no team) is taken'},
        )
    # hordelite extension: a worker that stops says so (``online: false``)
    # and leaves the pool at once; only its next pop brings it back.
    online = body.get("online")
    if online is not None and online is not False:
        raise bad_request("online", "only false is accepted: a pop brings a worker online")
    edit = WorkerEdit(
        maintenance=maintenance,
        info=info,
        name=name,
        name_key=name_key,
        paused=paused,
        team=team,
        offline=online is False,
        reset_suspicion=bool(reset_suspicion),
    )
    if edit == WorkerEdit():
        raise HordeError(RC.NoWorkerModSelected)
    return edit


def _flag(body: Any, key: str) -> bool | None:
    if body.get(key) is None:
        return None
    return get_bool(body, key, key, False)
