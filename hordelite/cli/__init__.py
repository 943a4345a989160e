"""The ``hordelite`` command: serve, worker, keys, kudos, workers, db."""

from hordelite.cli._main import main

__all__ = ["main"]
