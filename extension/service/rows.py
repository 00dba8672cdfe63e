"""The store's tables (SQLAlchemy 2 ORM). The alembic migrations in ``migrations/`` own the
schema; these classes must match them (tests/service/test_store_databases.py checks there is
no drift). What each table is for: docs/service.md "The store"."""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class PlanRow(Base):
    __tablename__ = "plans"

    path: Mapped[str] = mapped_column(String(512), primary_key=True)
    share: Mapped[float] = mapped_column(Float, default=1.0)
    # NULL means no limit on that resource
    limit_gpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    limit_cpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    limit_memory: Mapped[float | None] = mapped_column(Float, nullable=True)
    user_leaf: Mapped[bool] = mapped_column(Boolean, default=False)
    member_users: Mapped[list] = mapped_column(JSON, default=list)
    member_groups: Mapped[list] = mapped_column(JSON, default=list)
    # seconds, NULL: none here (a job's limit comes from the nearest default on its path, and
    # may not exceed the smallest maximum on it: runtime_limits.py)
    runtime_default: Mapped[float | None] = mapped_column(Float, nullable=True)
    runtime_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    created: Mapped[float] = mapped_column(Float)
    updated: Mapped[float] = mapped_column(Float)


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_user_idempotency_key", "user", "idempotency_key", unique=True),
        # a listing's pages seek to where the last one ended (paging.py), everyone's or a user's
        Index("ix_jobs_submitted_id", "submitted", "id"),
        Index("ix_jobs_user_submitted_id", "user", "submitted", "id"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    plan: Mapped[str] = mapped_column(String(512))
    leaf: Mapped[str] = mapped_column(String(512), index=True)
    kind: Mapped[str] = mapped_column(String(32), default="train")
    state: Mapped[str] = mapped_column(String(32), index=True)
    gpu: Mapped[float] = mapped_column(Float)
    cpu: Mapped[float] = mapped_column(Float)
    memory: Mapped[float] = mapped_column(Float)
    limits: Mapped[dict] = mapped_column(JSON, default=dict)
    min_workers: Mapped[int] = mapped_column(Integer)
    max_workers: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True)
    command: Mapped[list] = mapped_column(JSON, default=list)
    request: Mapped[dict] = mapped_column(JSON, default=dict)  # the body as submitted
    workdir: Mapped[str] = mapped_column(Text)
    env: Mapped[dict] = mapped_column(JSON, default=dict)
    name: Mapped[str] = mapped_column(String(255), default="")
    submitted: Mapped[float] = mapped_column(Float)
    started: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended: Mapped[float | None] = mapped_column(Float, nullable=True)
    placement: Mapped[list] = mapped_column(JSON, default=list)
    terminating: Mapped[bool] = mapped_column(Boolean, default=False)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    # the last checkpoint its runtime reported (time, and the script's progress figure)
    checkpointed: Mapped[float | None] = mapped_column(Float, nullable=True)
    checkpoint_progress: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the runtime limit in effect (seconds; NULL: none), and whether the service is stopping
    # the job for reaching it: kept so that a stop under way at a restart still ends TIMEOUT
    max_runtime: Mapped[float | None] = mapped_column(Float, nullable=True)
    timeout_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # whether it started as a starved gang, never a victim then (docs/scheduling.md
    # "Admission 6")
    aged: Mapped[bool] = mapped_column(Boolean, default=False)
    # the client's Idempotency-Key: the same key from the same user is the same job
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)


class TransitionRow(Base):
    __tablename__ = "transitions"
    __table_args__ = (Index("ix_transitions_leaf_at", "leaf", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    leaf: Mapped[str] = mapped_column(String(512))
    event: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(32))
    workers: Mapped[int] = mapped_column(Integer)  # workers holding resources from ``at`` on
    gpu: Mapped[float] = mapped_column(Float)  # per-worker request
    cpu: Mapped[float] = mapped_column(Float)
    memory: Mapped[float] = mapped_column(Float)
    placement: Mapped[list] = mapped_column(JSON, default=list)
    reason: Mapped[str] = mapped_column(Text, default="")


class DecisionRow(Base):
    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    job_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    detail: Mapped[dict] = mapped_column(JSON, default=dict)


class MetaRow(Base):
    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
