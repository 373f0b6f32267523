"""The Citus cluster the tests in this folder share: started once per test session.

Without a Citus build (``AKADZE_CITUS_BIN`` unset and ``shared/tools/citus-build`` exits 3)
every test here skips with the one-line reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from akadze_core import App
from akadze_core.store.queries import use_dialect
from tests.citus.cluster import CitusCluster, citus_bin


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A three-node cluster takes ~20 s to start: every test here counts as slow.
    for item in items:
        if "tests/citus/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[CitusCluster]:
    """A started coordinator + two workers, stopped by pid at the end of the session."""
    bin_dir, reason = citus_bin()
    if bin_dir is None:
        pytest.skip(reason)
    with CitusCluster(bin_dir) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def citus_url(citus_cluster: CitusCluster) -> str:
    """The coordinator's URL, its database migrated in Citus mode."""
    from akadze_core.store.migrations import migrate

    with psycopg.connect(citus_cluster.url(), autocommit=True) as connection:
        migrate(connection, citus=True)
    return citus_cluster.url()


@pytest.fixture
def citus_db(citus_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the coordinator; the jobs left by earlier tests removed."""
    with psycopg.connect(citus_url, autocommit=True) as connection:
        connection.execute("TRUNCATE akadze.jobs")
        yield connection


@pytest.fixture
async def citus_app(citus_url: str, citus_db: psycopg.Connection) -> AsyncIterator[App]:
    """An App in Citus mode on the coordinator; the process's dialect set back afterwards
    (the other tests of this process run on one server)."""
    application = App(citus_url, citus=True)
    try:
        yield application
    finally:
        await application.close_async()
        use_dialect("postgres")
