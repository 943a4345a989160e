"""The horde's modes (the AI Horde's ``HordeModes``): what each one refuses,
the body that sets them, and what "silent" means in raid mode. Pure: the
horde keeps the modes in storage and caches them per process
(hordelite.horde.modes).

- ``maintenance``: new requests are refused (400 MaintenanceMode, as the
  AI Horde answers); workers keep popping the queued jobs and submitting
  the ones in flight, so what was queued still completes.
- ``raid``: anonymous requests are refused or throttled (``[moderation]
  raid_anonymous``); a pop that would register a new worker name is refused
  unless its owner is trusted or an admin; and every countermeasure is
  silent (``silenced``).
- ``invite_only``: the AI Horde's "only invited workers join". hordelite
  has no self-registration (an operator creates every key), so the invited
  are the trusted: a pop that would register a new worker name is refused
  (WorkerInviteOnly) unless its owner is trusted or an admin.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from hordelite.contract._fields import expect_object
from hordelite.errors import RC, HordeError, bad_request

# The body's fields (GET and PUT /status/modes), by the mode they set.
FIELDS: Final = {
    "maintenance_mode": "maintenance",
    "invite_only_mode": "invite_only",
    "raid_mode": "raid",
}
# [moderation] raid_anonymous: what raid mode does to an anonymous request.
RAID_ANONYMOUS: Final = ("refuse", "throttle")


@dataclasses.dataclass(frozen=True)
class Modes:
    """The horde's modes; all off on a horde that never set them."""

    maintenance: bool = False
    invite_only: bool = False
    raid: bool = False

    @property
    def silent(self) -> bool:
        """Whether countermeasures are silent now (raid mode): see ``silenced``."""
        return self.raid

    @property
    def closed_to_new_workers(self) -> bool:
        """Whether a pop that registers a new worker name needs a trusted owner."""
        return self.raid or self.invite_only


def parse_modes_edit(body: Any) -> dict[str, bool]:
    """The modes a PUT /status/modes body sets (by mode name); 400 naming
    the field for a value that is not a boolean, 400 NoHordeModSelected
    when it sets none (the AI Horde's)."""
    body = expect_object(body, "body")
    changes: dict[str, bool] = {}
    for field, mode in FIELDS.items():
        value = body.get(field)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise bad_request(field, "must be true or false")
        changes[mode] = value
    if not changes:
        raise HordeError(RC.NoHordeModSelected)
    return changes


def silenced(refusal: HordeError) -> HordeError:
    """A countermeasure's refusal as raid mode answers it: the same return
    code and status with the code's general message, and no extra field
    (no reason, no remaining time, no Retry-After), so that an attacker
    learns neither that it was singled out nor for how long."""
    return HordeError(refusal.rc)


def new_worker_refusal() -> HordeError:
    """The refusal of a pop registering a new worker name while the horde
    is closed to new workers: the same in raid mode as in invite-only mode,
    so that raid mode does not show."""
    return HordeError(RC.WorkerInviteOnly)
