"""The ASGI app: native /api/v2 routes (and, later, the OpenAI /v1 front)."""

from hordelite.api.app import create_app

__all__ = ["create_app"]
