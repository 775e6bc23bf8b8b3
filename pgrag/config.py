"""Settings from arguments and PGRAG_* environment variables.

Precedence: an explicit argument, then the environment, then the default.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from psycopg import conninfo

from pgrag.errors import ConfigError

ENV_DATABASE_URL = "PGRAG_DATABASE_URL"
ENV_DATA_DIR = "PGRAG_DATA_DIR"
ENV_EMBEDDING_DIM = "PGRAG_EMBEDDING_DIM"
ENV_READER_ROLE = "PGRAG_READER_ROLE"
ENV_WRITER_ROLE = "PGRAG_WRITER_ROLE"

DEFAULT_EMBEDDING_DIM = 384
DEFAULT_HNSW_M = 16
DEFAULT_HNSW_EF_CONSTRUCTION = 64
DEFAULT_READER_ROLE = "pgrag_reader"
DEFAULT_WRITER_ROLE = "pgrag_writer"


def database_url(explicit: str | None = None) -> str | None:
    """The external database URL, or None to use the embedded server."""
    url = explicit or os.environ.get(ENV_DATABASE_URL) or None
    if url is not None:
        validate_url(url)
    return url


def validate_url(url: str) -> None:
    """Refuse a URL libpq cannot parse, naming the cause and the expected form."""
    try:
        params = conninfo.conninfo_to_dict(url)
    except Exception as exc:  # psycopg raises ProgrammingError with libpq's reason
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"malformed database URL ({reason}): use postgresql://USER:PASSWORD@HOST:PORT/DBNAME"
        ) from exc
    port = str(params.get("port") or "")
    if port and not all(part.strip().isdigit() for part in port.split(",")):
        raise ConfigError(
            f"malformed database URL (port {port!r} is not a number): "
            "use postgresql://USER:PASSWORD@HOST:PORT/DBNAME"
        )
    if "://" not in url and "=" not in url:
        raise ConfigError(
            f"malformed database URL {url!r}: use postgresql://USER:PASSWORD@HOST:PORT/DBNAME"
        )


def data_dir(explicit: str | Path | None = None) -> Path:
    """The embedded server's data directory (the PostgreSQL cluster itself)."""
    raw = explicit or os.environ.get(ENV_DATA_DIR)
    if raw:
        return Path(raw).expanduser().absolute()
    return platformdirs.user_data_path("pgrag") / "postgres-18"


def embedding_dim(explicit: int | None = None) -> int | None:
    """The dimension asked for at migration time, or None for "the store's, or the default"."""
    if explicit is not None:
        return check_dimension_value(explicit)
    raw = os.environ.get(ENV_EMBEDDING_DIM)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(
            f"{ENV_EMBEDDING_DIM}={raw!r} is not a whole number: set it to e.g. 384"
        ) from None
    return check_dimension_value(value)


def check_dimension_value(value: int) -> int:
    if not 1 <= value <= 2000:
        raise ConfigError(
            f"embedding dimension {value} is out of range: pgvector's HNSW index takes 1 to 2000"
        )
    return value


def role_name(kind: str, explicit: str | None = None) -> str | None:
    """The reader or writer role's name asked for at migration time (None: the default)."""
    env = ENV_READER_ROLE if kind == "reader" else ENV_WRITER_ROLE
    name = explicit or os.environ.get(env) or None
    if name is None:
        return None
    if len(name.encode()) > 63 or "\x00" in name:
        raise ConfigError(
            f"{kind} role name {name!r} is not a PostgreSQL role name: use at most 63 bytes"
        )
    return name
