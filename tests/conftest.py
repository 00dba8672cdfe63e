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
from typing import Any

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


# Run on one xdist worker: the tests of the one local Kubernetes cluster a session starts
# (tests/k8s/conftest.py), which would start a second cluster on a second worker.
ONE_WORKER = "tests/k8s/"
# The longest modules first (minutes on 2 cores), so that the last ones handed out are short
# and both workers end together; the rest keep their order.
LONGEST_FIRST = (
    ONE_WORKER,
    "tests/spawner/test_local.py",
    "tests/e2e/test_sim_matches_service.py",
    "tests/e2e/test_sim_matches_service_history.py",
    "tests/e2e/test_new_user.py",
    "tests/magics/test_notebook.py",
    "tests/e2e/test_new_user_not_root.py",
    "tests/metering/test_prometheus.py",
    "tests/cli/test_cli.py",
    "tests/backends/test_local_ddp.py",
    "tests/service/test_backup.py",
    "tests/spawner/test_culler.py",
    "tests/spawner/test_culler_orphans.py",
    "tests/service/test_checkpoint_hub.py",
)


def _rank(item: pytest.Item) -> int:
    for i, prefix in enumerate(LONGEST_FIRST):
        if item.nodeid.startswith(prefix):
            return i
    return len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first (a stable sort: each module's own order stays)."""
    items.sort(key=_rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``pytest -n N``: each module's tests on one worker, so its module-scoped hubs and
    rigs start once, and all of tests/k8s on one worker. Most of the suite waits on processes
    (hubs, workers, a browser), not on the CPU: two workers on two cores take about half the
    time. Modules are handed out in collection order (``--no-loadscope-reorder``, in the
    Makefile), longest first. (xdist's ``loadgroup`` marks no longer reach pytest 9's node ids.)"""
    from xdist.scheduler import LoadFileScheduling

    class ModulesAndOneCluster(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:  # xdist's hook for a scheduler's scope
            if nodeid.startswith(ONE_WORKER):
                return ONE_WORKER
            return super()._split_scope(nodeid)

    return ModulesAndOneCluster(config, log)


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
