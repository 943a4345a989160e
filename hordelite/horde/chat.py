"""The parts of a chat status that text requests do not have: why no online
worker can take a request, and the ``chat`` summary of the model list.
(What admission does at submit is ``hordelite.contract.chat_admission``.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hordelite.contract.chat_admission import serving
from hordelite.contract.eligibility import (
    DECLARATION_GAPS,
    LIMIT_GAPS,
    RequestView,
    WorkerView,
    skip_reason,
)
from hordelite.errors import RC
from hordelite.horde.results import Impossible


def impossible_reason(view: RequestView, online: Sequence[WorkerView]) -> Impossible | None:
    """Why no online worker can take this chat request, or None when one can.

    A declaration gap (a feature, a guarantee or the tools temperature) comes
    before a limit gap; neither is reported when only restrictions the client
    chose (worker lists, trusted workers) stand in the way.
    """
    pool = serving(online, view.models)
    if not pool:
        return _impossible(RC.no_eligible_worker)
    gaps = [skip_reason(w, view) for w in pool]
    if None in gaps:
        return None
    if any(g in DECLARATION_GAPS for g in gaps):
        return _impossible(RC.no_worker_supports_features)
    if all(g in LIMIT_GAPS for g in gaps):
        return _impossible(RC.no_worker_supports_limit)
    return None


def _impossible(rc: RC) -> Impossible:
    return Impossible(rc, rc.default_message)


def chat_summary(online: Sequence[WorkerView]) -> dict[str, dict[str, Any]]:
    """Per chat model: its online chat workers, their largest limits, the
    sorted union of their features (the ``chat`` object of the model list)."""
    summary: dict[str, dict[str, Any]] = {}
    for w in online:
        if w.maintenance or w.chat_model is None:
            continue
        entry = summary.setdefault(
            w.chat_model,
            {"workers": 0, "max_context_length": 0, "max_length": 0, "features": set()},
        )
        entry["workers"] += 1
        entry["max_context_length"] = max(entry["max_context_length"], w.chat_max_context_length)
        entry["max_length"] = max(entry["max_length"], w.chat_max_length)
        entry["features"].update(w.chat_features)
    for entry in summary.values():
        entry["features"] = sorted(entry["features"])
    return summary
