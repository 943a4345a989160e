"""One exception root: every exception class hordelite defines derives from
HordeliteError, and the handlers that catch the precise classes answer as
they did before the root existed.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import hordelite.server  # imports the api and front in their working order
from hordelite.errors import RC, ConfigError, HordeError, HordeliteError, StorageUnavailable
from hordelite.http.answer import Answer
from hordelite.http.dispatch import Dispatcher, Route, Table
from hordelite.http.envelopes import native
from hordelite.http.request import Request, Settings
from hordelite.http.routes import horde_app
from hordelite.testing import open_horde

PACKAGE = Path(hordelite.server.__file__).resolve().parent


def defined_exceptions() -> Iterator[tuple[str, type[BaseException]]]:
    """Every class defined in the package that is an exception."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module_name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
        if not classes:
            continue
        module = importlib.import_module(module_name)
        for name in classes:
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                yield f"{module_name}.{name}", cls


EXCEPTIONS = dict(defined_exceptions())


def test_the_package_defines_the_exceptions_the_tree_names() -> None:
    # Not vacuous: the scan finds the public and the private ones.
    names = {name.rsplit(".", 1)[1] for name in EXCEPTIONS}
    assert {
        "HordeliteError",
        "HordeError",
        "StorageUnavailable",
        "ConfigError",
        "WorkerError",
        "BackendError",
        "HordeUnavailable",
        "HordeRefusal",
        "UnsendableJob",
        "Unjudged",
        "_Busy",
    } <= names


@pytest.mark.parametrize("name", sorted(EXCEPTIONS))
def test_every_exception_of_the_package_derives_from_HordeliteError(name: str) -> None:
    assert issubclass(EXCEPTIONS[name], HordeliteError), name


def test_the_root_is_a_plain_Exception_so_cancellation_passes_it() -> None:
    # except HordeliteError never swallows a cancellation or KeyboardInterrupt.
    assert HordeliteError.__bases__ == (Exception,)


@pytest.mark.parametrize(
    ("error", "status", "rc"),
    [
        (HordeError(RC.WorkerMaintenance), 403, "WorkerMaintenance"),
        (StorageUnavailable("connection refused"), 503, "StorageUnavailable"),
        # Not a refusal: raised inside a route, it is an unexpected failure.
        (ConfigError("horde.job_ttl: must be positive"), 500, "InternalServerError"),
        (RuntimeError("boom"), 500, "InternalServerError"),
    ],
)
@pytest.mark.anyio
async def test_the_native_api_renders_each_exception_as_before(
    anyio_backend: str, error: Exception, status: int, rc: str
) -> None:
    async def _raise(request: Request) -> Answer:
        raise error

    async with open_horde() as horde:
        # The horde's dispatcher, with one more route that raises.
        served = horde_app(horde.horde, anyio_backend)
        routes = [*served.dispatcher.table.routes, Route("GET", "/test/raise", _raise, native)]
        app = Dispatcher(Table(routes), Settings.of(horde.horde.config.server))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.get("/test/raise")
        assert response.status_code == status
        body = response.json()
        assert body["rc"] == rc
