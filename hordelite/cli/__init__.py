"""The ``hordelite`` command: serve, worker, keys, db."""

from hordelite.cli._main import main

__all__ = ["main"]
