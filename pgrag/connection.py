"""Where the database is, and one connection to it, with failures as one-line errors.

The lowest layer that does I/O: it knows the configuration and the embedded server, and
nothing of the store. ``resolve_url`` is the one place that decides which database a command
uses: an explicit URL, else ``PGRAG_DATABASE_URL``, else (only where asked for: the CLI, the
migrations' command line, the benchmarks) the embedded server, started if needed. A multi-host
URL resolves to its primary (libpq's ``target_session_attrs=read-write``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg

from pgrag import config
from pgrag.errors import ConfigError, ConnectionFailed

CONNECT_TIMEOUT_S = 5


def resolve_url(url: str | None, *, embedded: bool = True) -> str:
    """An explicit URL, else PGRAG_DATABASE_URL, else, with ``embedded``, the embedded server
    (started if needed); without it, a ConfigError that says how to choose."""
    resolved = config.database_url(url)
    if resolved is not None:
        # a multi-host URL (a primary and its standbys): libpq's read-write target, so that
        # migrations, the worker and every command reach the primary (pgrag/replicas.py)
        from pgrag.replicas import split_url

        return split_url(resolved)[0]
    if not embedded:
        raise ConfigError(
            "no database given: pass a URL (postgresql://USER:PASSWORD@HOST:PORT/DBNAME), set "
            f"{config.ENV_DATABASE_URL}, or connect(embedded=True) to start pgrag's embedded "
            "PostgreSQL"
        )
    from pgrag.server import EmbeddedServer

    return EmbeddedServer().ensure()


def describe_target(url: str) -> str:
    """host:port/dbname for messages (never the password)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "the database"
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    return f"{host}:{port}/{params.get('dbname') or params.get('user') or ''}"


@contextlib.contextmanager
def connect_once(url: str, *, autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """One plain connection, with connection failures turned into ConnectionFailed."""
    config.validate_url(url)
    try:
        conn = psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as exc:
        raise ConnectionFailed(
            f"cannot connect to {describe_target(url)} ({first_line(str(exc))}): check that the "
            "server runs and the URL is right, or unset PGRAG_DATABASE_URL to use the embedded "
            "server"
        ) from exc
    with conn:
        yield conn


def first_line(text: str) -> str:
    """The first non-empty line of a driver message, without libpq's prefix."""
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line.removeprefix("connection failed: ")
    return "no reason given"
