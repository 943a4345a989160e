"""The ``hordelite`` command: serve, keys, db."""

from hordelite.cli._main import main

__all__ = ["main"]
