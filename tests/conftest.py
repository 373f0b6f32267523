"""Shared fixtures: a real Postgres, and a fresh database per test cloned from a template.

The server is ``AKADZE_TEST_DATABASE_URL`` (an admin URL), else the local 127.0.0.1:5432,
else the embedded Postgres (pgserver) started in a temporary directory.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from akadze_core import App
from akadze_core.store.migrations import migrate

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _reachable(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


@pytest.fixture(scope="session")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A superuser URL of a Postgres server that the tests may create databases on."""
    url = os.environ.get("AKADZE_TEST_DATABASE_URL", DEFAULT_ADMIN_URL)
    if _reachable(url):
        yield url
        return
    import pgserver  # the embedded Postgres, for machines without a server

    server = pgserver.get_server(tmp_path_factory.mktemp("pgserver"), cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


def database_url_for(admin_url: str, name: str) -> str:
    """``admin_url`` pointed at database ``name``."""
    params = conninfo_to_dict(admin_url)
    params["dbname"] = name
    return make_conninfo(**params)


@pytest.fixture(scope="session")
def template_database(admin_url: str) -> Iterator[str]:
    """A database with the schema applied, cloned by every test."""
    name = f"akadze_template_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(database_url_for(admin_url, name), autocommit=True) as connection:
        migrate(connection)
    yield name
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


def create_database(admin_url: str, template: str | None) -> str:
    """Create a uniquely named database (a clone of ``template`` if given); returns its name."""
    name = f"akadze_test_{uuid.uuid4().hex[:12]}"
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(query)
    return name


def drop_database(admin_url: str, name: str) -> None:
    """Drop a test database, disconnecting whoever is still on it."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


@pytest.fixture
def database_url(admin_url: str, template_database: str) -> Iterator[str]:
    """A fresh database with the akadze schema, for this test only."""
    name = create_database(admin_url, template_database)
    yield database_url_for(admin_url, name)
    drop_database(admin_url, name)


@pytest.fixture
def empty_database_url(admin_url: str) -> Iterator[str]:
    """A fresh database without the akadze schema."""
    name = create_database(admin_url, None)
    yield database_url_for(admin_url, name)
    drop_database(admin_url, name)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test database, for assertions."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
async def app(database_url: str) -> AsyncIterator[App]:
    """An App on the test database (no tasks registered)."""
    application = App(database_url)
    yield application
    await application.close_async()


@pytest.fixture
def project_root() -> Path:
    """The repository root."""
    return Path(__file__).resolve().parent.parent
