"""Alembic migrations of the wmla service store (run by ``Store.open``)."""
