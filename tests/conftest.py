"""Suite-wide fixtures: the store's database, SQLite and a real PostgreSQL server.

``store_url`` is parametrized: every test that takes it runs once on a SQLite file and once on
a new database of a PostgreSQL server (``tests/pg.py``) that the first such test starts and the
end of the session stops. Where PostgreSQL is not installed the ``postgresql`` runs skip, saying
why; ``-m "not postgresql"`` leaves them out.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from extension.service.store import sqlite_url

from .pg import PostgresServer, unavailable

# The hubs of the suite run jupyterhub_config.py as root, where each user folder would get a
# storage image (10 GiB by default): only the tests about storage quotas ask for them
os.environ.setdefault("WMLA_STORAGE_QUOTA", "")

DATABASES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "postgresql: runs against the real PostgreSQL server of tests/pg.py"
    )


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (a fresh cluster, stopped by PID at the end)."""
    why = unavailable()
    if why:
        pytest.skip(why)
    server = PostgresServer(tmp_path_factory.mktemp("postgres"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module", params=DATABASES)
def database(request: pytest.FixtureRequest) -> str:
    """``sqlite`` or ``postgresql``: the kind of database this run of the test uses (module
    scope, so that module-scoped rigs can take it too: a module runs on SQLite, then again on
    PostgreSQL)."""
    return request.param


def _new_database(kind: str, request: pytest.FixtureRequest, folder: Path) -> str:
    if kind == "sqlite":
        return sqlite_url(folder / "wmla.sqlite")
    return request.getfixturevalue("postgres").create_database()


@pytest.fixture
def store_url(database: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL for ``Store.open``: a new SQLite file, or a new database on the PostgreSQL server."""
    return _new_database(database, request, tmp_path)


@pytest.fixture(scope="module")
def module_store_url(
    database: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """``store_url`` for a module-scoped rig: one new database for the module's tests."""
    return _new_database(database, request, tmp_path_factory.mktemp("store"))
