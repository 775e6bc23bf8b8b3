"""Settings from arguments and PGRAG_* environment variables: the one place that reads them.

``VARIABLES`` is the table of every variable pgrag reads (name, default, meaning): the README's
configuration table is generated from it (``python -m tests.test_docs --update``; a test checks
it is current), and ``env(name)`` is the only reader of the environment, refusing a name the
table does not list. ``Settings.from_env()`` reads them all at once, typed. Precedence
everywhere: an explicit argument, then the environment, then the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from psycopg import conninfo

from pgrag.errors import ConfigError


@dataclass(frozen=True)
class Variable:
    name: str
    default: str  # as the README shows it ("" when there is none)
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable("PGRAG_DATABASE_URL", "", "PostgreSQL (with pgvector) to use; unset, the CLI uses "
             "the embedded server and `pgrag.connect()` needs `embedded=True`"),
    Variable("PGRAG_DATA_DIR", "~/.local/share/pgrag/postgres-18",
             "the embedded server's data directory"),
    Variable("PGRAG_EMBEDDING_DIM", "384", "the vector dimension chosen at the first migration"),
    Variable("PGRAG_READER_ROLE", "pgrag_reader", "the reader role revision 0006 creates if "
             "missing ([security](docs/security.md))"),
    Variable("PGRAG_WRITER_ROLE", "pgrag_writer", "the writer role revision 0006 creates if "
             "missing"),
    Variable("PGRAG_EMBEDDER", "sentence-transformers", "the embedder: `sentence-transformers`"
             "[`:PATH`], `onnx`[`:DIR`], `openai:MODEL` ([embeddings](docs/embeddings.md))"),
    Variable("PGRAG_OPENAI_BASE_URL", "", "an OpenAI-compatible embeddings endpoint (else "
             "`OPENAI_BASE_URL`, else OpenAI)"),
    Variable("PGRAG_OPENAI_API_KEY", "", "its key (else `OPENAI_API_KEY`)"),
    Variable("PGRAG_OPENAI_DIMENSIONS", "", "the `dimensions` to ask it for"),
    Variable("PGRAG_OPENAI_BATCH_SIZE", "256", "texts per embeddings request"),
    Variable("PGRAG_LLM_MODEL", "", "the chat model that writes answers (unset: extractive "
             "answers)"),
    Variable("PGRAG_LLM_BASE_URL", "", "its OpenAI-compatible endpoint (e.g. "
             "`http://127.0.0.1:11434/v1`)"),
    Variable("PGRAG_LLM_API_KEY", "", "its key (else `OPENAI_API_KEY`)"),
    Variable("PGRAG_RERANK_MODEL", "", "a local cross-encoder folder to rerank with (unset: no "
             "reranking)"),
    Variable("PGRAG_RERANK_THRESHOLD", "", "drop reranked hits scoring below it"),
    Variable("PGRAG_QUERY_CACHE_TTL", "", "ignored since revision 0009 (with a warning): the "
             "query cache's TTL is the server's, `pgrag.settings.query_cache_ttl`"),
    Variable("PGRAG_TEST_DATABASE_URL", "", "the server the tests use (the role needs "
             "CREATEDB); else Docker, else the embedded server"),
)  # fmt: skip

_NAMES = frozenset(v.name for v in VARIABLES)


def env(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of a PGRAG_* variable pgrag reads (None when unset or empty)."""
    if name not in _NAMES:
        raise KeyError(f"{name} is not in pgrag.config.VARIABLES: add it there")
    return (os.environ if environ is None else environ).get(name) or None


ENV_DATABASE_URL = "PGRAG_DATABASE_URL"
ENV_DATA_DIR = "PGRAG_DATA_DIR"
ENV_EMBEDDING_DIM = "PGRAG_EMBEDDING_DIM"
ENV_READER_ROLE = "PGRAG_READER_ROLE"
ENV_WRITER_ROLE = "PGRAG_WRITER_ROLE"
ENV_EMBEDDER = "PGRAG_EMBEDDER"

DEFAULT_EMBEDDING_DIM = 384
DEFAULT_HNSW_M = 16
DEFAULT_HNSW_EF_CONSTRUCTION = 64
# The store index's graph by store size (`pgrag reindex`): from DENSE_GRAPH_FROM vectors, m 32
# and ef_construction 200. At 1,000,000 synthetic chunks the default graph gave held-out
# questions at best 0.93 (ef_search 800) and chunk vectors 0.938 (1000), where m 32 /
# ef_construction 200 reached 0.952 at ef_search 130; at 100,000 the default reaches 0.99
# (docs/benchmarks.md). Between them nothing was measured: the threshold is halfway.
DENSE_GRAPH_FROM = 500_000
# pgvector's bounds for an HNSW index's m and ef_construction (its hnsw.c: HNSW_MAX_M,
# HNSW_MAX_EF_CONSTRUCTION); the CLI's options and `pgrag status`'s advice keep within them,
# before any I/O; on the server pgrag._store_index_plan checks them (the same numbers) for SQL
# callers
MIN_HNSW_M, MAX_HNSW_M = 2, 100
MIN_HNSW_EF_CONSTRUCTION, MAX_HNSW_EF_CONSTRUCTION = 4, 1000
DENSE_HNSW_M = 32
DENSE_HNSW_EF_CONSTRUCTION = 200


def graph_for(vectors: int) -> tuple[int, int]:
    """The HNSW (m, ef_construction) for a store of this many vectors."""
    if vectors >= DENSE_GRAPH_FROM:
        return DENSE_HNSW_M, DENSE_HNSW_EF_CONSTRUCTION
    return DEFAULT_HNSW_M, DEFAULT_HNSW_EF_CONSTRUCTION


DEFAULT_READER_ROLE = "pgrag_reader"
DEFAULT_WRITER_ROLE = "pgrag_writer"


def database_url(explicit: str | None = None) -> str | None:
    """The external database URL, or None to use the embedded server."""
    url = explicit or env(ENV_DATABASE_URL)
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
    raw = explicit or env(ENV_DATA_DIR)
    if raw:
        return Path(raw).expanduser().absolute()
    return platformdirs.user_data_path("pgrag") / "postgres-18"


def embedding_dim(explicit: int | None = None) -> int | None:
    """The dimension asked for at migration time, or None for "the store's, or the default"."""
    if explicit is not None:
        return check_dimension_value(explicit)
    raw = env(ENV_EMBEDDING_DIM)
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
    variable = ENV_READER_ROLE if kind == "reader" else ENV_WRITER_ROLE
    name = explicit or env(variable)
    if name is None:
        return None
    if len(name.encode()) > 63 or "\x00" in name:
        raise ConfigError(
            f"{kind} role name {name!r} is not a PostgreSQL role name: use at most 63 bytes"
        )
    return name


#: The largest number of hash partitions ``--tenant-partitions N`` makes
#: (sql/migrate/store_shape.sql checks the same bound).
MAX_TENANT_PARTITIONS = 256


def tenant_partitions(value: str | None) -> str | None:
    """The chunk store's shape asked for at migration time (docs/scaling.md): ``none`` (one
    table), ``list`` (a partition per tenant) or N (hash into N partitions); None keeps it."""
    if value is None:
        return None
    text = value.strip().lower()
    if text in ("none", "list"):
        return text
    if text.isdigit() and 2 <= int(text) <= MAX_TENANT_PARTITIONS:
        return str(int(text))
    raise ConfigError(
        f"tenant partitions {value!r} is not none, list or a number from 2 to "
        f"{MAX_TENANT_PARTITIONS}: pass list (a partition per tenant), N (hash into N "
        "partitions) or none (one table)"
    )


@dataclass(frozen=True)
class Settings:
    """Every PGRAG_* setting, read once from the environment (``from_env``) and checked."""

    database_url: str | None
    data_dir: Path
    embedding_dim: int | None
    reader_role: str | None
    writer_role: str | None
    embedder: str | None

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database_url=database_url(),
            data_dir=data_dir(),
            embedding_dim=embedding_dim(),
            reader_role=role_name("reader"),
            writer_role=role_name("writer"),
            embedder=env(ENV_EMBEDDER),
        )
