"""Views of the pool's workers for the tests of the eligibility rules and
the queries that apply them."""

from __future__ import annotations

from typing import Any

from hordelite.contract.eligibility import WorkerView


def worker_view(**fields: Any) -> WorkerView:
    """An online, untrusted, one-thread text worker of ``m1`` that has not
    generated yet (the assumed speed); ``fields`` replace any of it."""
    base: dict[str, Any] = {
        "id": "w",
        "models": ("m1",),
        "max_length": 512,
        "max_context_length": 4096,
        "nsfw": False,
        "trusted": False,
        "threads": 1,
        "extra_slow": False,
        "maintenance": False,
        "tokens_generated": 0.0,
        "seconds_generating": 0.0,
    }
    return WorkerView(**{**base, **fields})
