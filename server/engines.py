"""Which engine serves the store: the one place that knows the engines by name.

The interface (`server/database.py`) never imports an engine; each engine imports the
interface. A new engine is its own module and one branch here.
"""

from __future__ import annotations

from server.config import is_database_url
from server.database import Database


def open_database(location: str) -> Database:
    """The engine for `location`: a ``postgresql://`` URL, else a SQLite path. Call `open()` next."""
    if is_database_url(location):
        from server.postgres_store import PostgresDatabase  # psycopg is imported only when configured

        return PostgresDatabase(location)
    from server.sqlite_store import SQLiteDatabase

    return SQLiteDatabase(location)
