"""pgrag: retrieval-augmented generation over relational data, inside PostgreSQL."""

from pgrag.db import Client, StoreSettings, StoreStatus, connect
from pgrag.errors import (
    ConfigError,
    ConnectionFailed,
    DimensionMismatch,
    DocumentError,
    InvalidFilter,
    MissingDependency,
    MissingExtension,
    NotMigrated,
    PgragError,
    ServerError,
)

__all__ = [
    "Client",
    "ConfigError",
    "ConnectionFailed",
    "DimensionMismatch",
    "DocumentError",
    "InvalidFilter",
    "MissingDependency",
    "MissingExtension",
    "NotMigrated",
    "PgragError",
    "ServerError",
    "StoreSettings",
    "StoreStatus",
    "connect",
]
