"""The chat suites' database fixture reaches the horde: a test parametrised
on PostgreSQL runs against PostgreSQL, in its own schema, not on SQLite."""

from __future__ import annotations

import pytest

from tests.integration._chat_helpers import chat_body, open_chat_horde

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("chat_database")]


async def test_the_chat_helpers_open_the_parametrised_database(
    chat_database: str | None,
) -> None:
    async with open_chat_horde() as env:
        db = env.horde.horde.db
        assert db.is_sqlite is (chat_database is None)
        if chat_database is not None:
            assert env.horde.database == chat_database
            schema = db.run_sync(
                lambda conn: conn.exec_driver_sql("SELECT current_schema()").scalar(), False
            )
            assert str(schema).startswith("hl_")
        await env.chat_worker("w")
        await env.queue(chat_body())
