"""pgrag: retrieval-augmented generation over relational data, inside PostgreSQL.

The error classes load with the package; the client (``connect``, ``Client``: psycopg's pool,
pgvector, numpy) and the search, question and answer machinery load on first use, so
``import pgrag`` stays fast, and so does the command line, which imports only what its command
needs. Search and ask through the client: ``client.search(...)``,
``client.ask(...)`` (``pgrag.search`` and ``pgrag.ask`` are the modules); on asyncio,
``await pgrag.aconnect(url)`` gives an ``AsyncClient``. ``pgrag.connect()`` needs a URL (or
``PGRAG_DATABASE_URL``), or ``embedded=True`` to start pgrag's embedded PostgreSQL.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pgrag.errors import (
    EXIT_CODES,
    ConfigError,
    ConnectionFailed,
    DimensionMismatch,
    DocumentError,
    EmbeddingFailed,
    IndexBuildFailed,
    InvalidFilter,
    MissingDependency,
    MissingExtension,
    ModelMismatch,
    NotMigrated,
    PgragError,
    ServerError,
)

if TYPE_CHECKING:
    from pgrag.answer import Answer, Context, LLMConfig
    from pgrag.ask import AskResult
    from pgrag.db import AsyncClient, Client, StoreSettings, StoreStatus, aconnect, connect
    from pgrag.documents import DocType, Mismatch, RebuildStats
    from pgrag.filters import parse_filter_json
    from pgrag.parse import LLMParser, ParsedQuery, parse_question
    from pgrag.rerank import Hit, Reranker
    from pgrag.search import SearchHit, SearchOptions, SearchResult, asearch
    from pgrag.security import tenant_scope

_LAZY = {
    "AsyncClient": "pgrag.db",
    "Client": "pgrag.db",
    "StoreSettings": "pgrag.db",
    "StoreStatus": "pgrag.db",
    "aconnect": "pgrag.db",
    "connect": "pgrag.db",
    "tenant_scope": "pgrag.security",
    "Answer": "pgrag.answer",
    "Context": "pgrag.answer",
    "LLMConfig": "pgrag.answer",
    "AskResult": "pgrag.ask",
    "DocType": "pgrag.documents",
    "Mismatch": "pgrag.documents",
    "RebuildStats": "pgrag.documents",
    "parse_filter_json": "pgrag.filters",
    "LLMParser": "pgrag.parse",
    "ParsedQuery": "pgrag.parse",
    "parse_question": "pgrag.parse",
    "Hit": "pgrag.rerank",
    "Reranker": "pgrag.rerank",
    "SearchHit": "pgrag.search",
    "SearchOptions": "pgrag.search",
    "SearchResult": "pgrag.search",
    "asearch": "pgrag.search",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pgrag' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "EXIT_CODES",
    "Answer",
    "AskResult",
    "AsyncClient",
    "Client",
    "ConfigError",
    "ConnectionFailed",
    "Context",
    "DimensionMismatch",
    "DocType",
    "DocumentError",
    "EmbeddingFailed",
    "IndexBuildFailed",
    "Hit",
    "InvalidFilter",
    "LLMConfig",
    "LLMParser",
    "Mismatch",
    "MissingDependency",
    "MissingExtension",
    "ModelMismatch",
    "NotMigrated",
    "ParsedQuery",
    "PgragError",
    "RebuildStats",
    "Reranker",
    "SearchHit",
    "SearchOptions",
    "SearchResult",
    "ServerError",
    "StoreSettings",
    "StoreStatus",
    "aconnect",
    "asearch",
    "connect",
    "parse_filter_json",
    "parse_question",
    "tenant_scope",
]
