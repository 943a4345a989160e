"""The model reference: a model's size, which prices its jobs.

The operator edits a JSON file ``{"model name": {"parameters": 8030261248}}``
(hordelite ships one in hordelite/data/models.json; ``horde.model_reference``
points at another). A name matches exactly, then case-insensitively, then by
the part after its last "/" (koboldcpp registers "koboldcpp/<model>"). A model
not in the file is priced as a 1 billion parameter model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hordelite.contract.limits import UNKNOWN_MODEL_BILLIONS
from hordelite.errors import ConfigError

DEFAULT_REFERENCE = Path(__file__).resolve().parent.parent / "data" / "models.json"


class ModelReference:
    def __init__(self, sizes: Mapping[str, float]) -> None:
        self._billions = {name.lower(): value for name, value in sizes.items()}

    @classmethod
    def from_json(cls, data: Any, source: str = "model reference") -> ModelReference:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object of model names")
        sizes: dict[str, float] = {}
        for name, entry in data.items():
            params = entry.get("parameters") if isinstance(entry, dict) else None
            if isinstance(params, bool) or not isinstance(params, int | float) or params <= 0:
                raise ConfigError(f"{source}: {name}.parameters must be a positive number")
            sizes[name] = params / 1e9
        return cls(sizes)

    @classmethod
    def load(cls, path: str | Path | None = None) -> ModelReference:
        file = Path(path) if path else DEFAULT_REFERENCE
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"horde.model_reference: cannot read {str(file)!r}: {exc}") from None
        return cls.from_json(data, str(file))

    def knows(self, model: str) -> bool:
        """Whether the reference lists this model (by the same matching)."""
        name = model.split("::", 1)[0].lower()
        return name in self._billions or ("/" in name and name.rsplit("/", 1)[1] in self._billions)

    def billions(self, model: str) -> float:
        """The model's size in billions of parameters (1 when unknown)."""
        name = model.split("::", 1)[0].lower()
        size = self._billions.get(name)
        if size is None and "/" in name:
            size = self._billions.get(name.rsplit("/", 1)[1])
        return size if size is not None else UNKNOWN_MODEL_BILLIONS
