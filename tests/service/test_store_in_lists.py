"""The store's IN lists (``store.in_batches``): padded to a power of two, so that the queries by
a list of job ids are a few statements, each prepared once a connection, whatever the number of
ids (SQLite keeps each length prepared: docs/service.md "Memory over 100,000 jobs"), and answer
the same as unpadded ones."""

from __future__ import annotations

from sqlalchemy import event

from extension.service.rows import JobRow
from extension.service.store import IN_BATCH, Store, in_batches

from .test_store_databases import _job_values

SIZES = [0, 1, 2, 3, 5, 8, 9, 100, 127, 129, 300, 511, 512, 513, 1100]


def test_in_lists_are_a_power_of_two_long_and_hold_the_ids_asked_for() -> None:
    for n in SIZES:
        ids = [f"j{k}" for k in range(n)]
        batches = list(in_batches(ids))
        assert all(len(b) <= IN_BATCH and len(b) & (len(b) - 1) == 0 for b in batches)
        assert [i for b in batches for i in dict.fromkeys(b)] == ids


def test_queries_by_ids_answer_the_same_from_a_few_statements(store_url: str) -> None:
    store = Store.open(store_url)
    seen: set[str] = set()

    def statement(conn: object, cursor: object, sql: str, *args: object) -> None:
        seen.add(sql)

    try:
        for k in range(600):
            store.add_job(JobRow(**_job_values(f"job-{k}")), at=1_800_000_000.0)
        event.listen(store.engine, "before_cursor_execute", statement)
        for n in SIZES:
            ids = [f"job-{k}" for k in range(0, 2 * n, 2)]  # half of them not stored
            stored = {i for i in ids if int(i.split("-")[1]) < 600}
            assert set(store.jobs_by_id(ids)) == stored
            assert set(store.fold_facts(ids)) == stored
        in_lists = [sql for sql in seen if " IN (" in sql.upper()]
        assert len(in_lists) <= 2 * 10, len(in_lists)  # two queries, ten lengths each
    finally:
        store.close()
