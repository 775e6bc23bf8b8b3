"""PgragError and its few subclasses; SQLSTATE → class.

Every error pgrag raises on purpose says what went wrong and how to fix it, in one line.
The CLI prints ``str(error)`` and exits with ``error.exit_code``; it never shows a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


class PgragError(Exception):
    """Base class: a failure with a cause and a fix."""

    exit_code = 1


class ConfigError(PgragError, ValueError):
    """A setting or argument that cannot work (malformed URL, bad option value)."""

    exit_code = 2


class ServerError(PgragError):
    """The embedded PostgreSQL server cannot be started or used."""

    exit_code = 3


class ConnectionFailed(PgragError):
    """The database server does not answer or refuses the connection."""

    exit_code = 3


class MissingExtension(PgragError):
    """The server has no pgvector extension to install."""

    exit_code = 3


class NotMigrated(PgragError):
    """The database has no pgrag schema yet (or an older one)."""

    exit_code = 4


class DimensionMismatch(PgragError, ValueError):
    """A vector or model whose dimension differs from the store's."""

    exit_code = 5


class DocumentError(PgragError, ValueError):
    """A document type declaration that cannot work, or a render that failed."""

    exit_code = 6


class InvalidFilter(PgragError, ValueError):
    """A metadata filter with an unknown key or operator, or a value of the wrong type."""

    exit_code = 7


class IndexBuildFailed(PgragError):
    """A filter index build failed or was cancelled (pgrag/filter_index.py); nothing is left."""


class IndexBusy(IndexBuildFailed):
    """Another session builds or drops an index of the chunks (pgrag/filter_index.py): one at
    a time."""


class MissingDependency(PgragError, ImportError):
    """An optional Python package that this feature needs is not installed."""

    exit_code = 8


# SQLSTATEs raised by pgrag's own SQL functions and triggers (sql/idempotent/00_core.sql).
SQLSTATE_CLASSES: dict[str, type[PgragError]] = {
    "PR002": DimensionMismatch,
    "PR003": DocumentError,
    "PR004": DocumentError,
    "PR005": InvalidFilter,
    "PR006": ConfigError,
    # another role's declared SQL refused in a privileged session (pgrag._refuse_declared)
    "PR008": ConfigError,
}


@contextmanager
def mapped_database_errors() -> Iterator[None]:
    """Re-raise database errors that pgrag raised itself (its SQLSTATEs) as PgragErrors."""
    try:
        yield
    except psycopg.Error as exc:
        mapped = from_database(exc)
        if mapped is not None:
            raise mapped from exc
        raise


def from_database(exc: psycopg.Error) -> PgragError | None:
    """The PgragError for a database error pgrag raised itself, or None.

    Matches on SQLSTATE, never on message text. The message and hint come from the SQL side.
    """
    sqlstate = exc.sqlstate
    if sqlstate is None:
        return None
    cls = SQLSTATE_CLASSES.get(sqlstate)
    if cls is None:
        return None
    diag = exc.diag
    text = diag.message_primary or str(exc)
    if diag.message_hint:
        text = f"{text}: {diag.message_hint}"
    error = cls(text)
    error.__cause__ = exc
    return error


# ---- embeddings (pgrag/embed, pgrag/worker.py) ----


class ModelMismatch(PgragError):
    """An embedder whose model differs from the one that made this store's vectors."""

    exit_code = 5


class EmbeddingFailed(PgragError):
    """The embedder failed (network, bad response, wrong dimension) after its retries."""

    exit_code = 9


SQLSTATE_CLASSES["PR007"] = ModelMismatch


# What each exit code means (the CLI's `pgrag --help`, the README; tests/test_docs.py checks the
# README shows this table and that every error class's code is in it).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "any other error"),
    (2, "bad usage or configuration, or a permission the role lacks"),
    (3, "the server is unreachable, cannot start or lacks pgvector"),
    (4, "the database is not migrated"),
    (5, "an embedding dimension or model mismatch"),
    (6, "a document declaration or render error"),
    (7, "an invalid filter"),
    (8, "a missing optional dependency"),
    (9, "the embedder failed after its retries"),
    (130, "interrupted"),
)

__all__ = [
    "EXIT_CODES",
    "SQLSTATE_CLASSES",
    "ConfigError",
    "ConnectionFailed",
    "DimensionMismatch",
    "DocumentError",
    "EmbeddingFailed",
    "IndexBuildFailed",
    "IndexBusy",
    "InvalidFilter",
    "MissingDependency",
    "MissingExtension",
    "ModelMismatch",
    "NotMigrated",
    "PgragError",
    "ServerError",
    "from_database",
    "mapped_database_errors",
]
