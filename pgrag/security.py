"""Tenants on the Python side: the setting ``pgrag.tenant`` for a block of work.

Row-level security on ``pgrag.chunks`` (``sql/idempotent/40_security.sql``, docs/security.md)
shows a session its tenant's chunks and the shared ones. The tenant is the session role's
binding in ``pgrag.tenant_roles`` when it has one (``bind_tenant_role``), else the setting
``pgrag.tenant``, which ``tenant_scope`` sets for one transaction and ``pgrag.connect(tenant=...)``
for every pooled connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any, LiteralString

import psycopg

from pgrag.errors import ConfigError, mapped_database_errors

TENANT_SETTING = "pgrag.tenant"
_SET_LOCAL: LiteralString = "select set_config('pgrag.tenant', %(tenant)s, true)"
_SET_SESSION: LiteralString = "select set_config('pgrag.tenant', %(tenant)s, false)"
_CURRENT: LiteralString = "select coalesce(current_setting('pgrag.tenant', true), '')"


def check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not tenant or "\x00" in tenant:
        raise ConfigError(f"tenant {tenant!r} is not a tenant: pass its non-empty text value")
    return tenant


@contextlib.contextmanager
def tenant_scope(conn: psycopg.Connection[Any], tenant: str | None) -> Iterator[None]:
    """Run the block as ``tenant`` (None: leave the session's tenant as it is).

    The block runs in a transaction (a savepoint inside one already open) where
    ``pgrag.tenant`` is set; the previous value is back when it ends, however it ends.
    """
    if tenant is None:
        yield
        return
    check_tenant(tenant)
    own = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with conn.transaction():
        row = conn.execute(_CURRENT).fetchone()
        conn.execute(_SET_LOCAL, {"tenant": tenant})
        yield
        conn.execute(_restore(own), {"tenant": row[0] if row else ""})


def _restore(own_transaction: bool) -> LiteralString:
    """How a scope puts the previous tenant back. Declared code the block runs (statistics, a
    refresh) runs in this session, and may make the scope's local value the session's
    (``set_config('pgrag.tenant', <the same value>, false)``: the same value, so pgrag's
    comparison around the call sees no change), which a local restore leaves in place after
    the commit: the pooled connection's next caller would read that tenant's chunks (found by
    review). A block that is its own transaction restores the session's value itself; inside
    the caller's transaction, a local value (the caller's own SET LOCAL keeps its meaning)."""
    return _SET_SESSION if own_transaction else _SET_LOCAL


@contextlib.asynccontextmanager
async def atenant_scope(
    conn: psycopg.AsyncConnection[Any], tenant: str | None
) -> AsyncIterator[None]:
    """``tenant_scope`` on an async connection."""
    if tenant is None:
        yield
        return
    check_tenant(tenant)
    own = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    async with conn.transaction():
        cur = await conn.execute(_CURRENT)
        row = await cur.fetchone()
        await conn.execute(_SET_LOCAL, {"tenant": tenant})
        yield
        await conn.execute(_restore(own), {"tenant": row[0] if row else ""})


def set_session_tenant(conn: psycopg.Connection[Any], tenant: str) -> None:
    """``pgrag.tenant`` for the rest of the session (the pool hook of ``connect(tenant=...)``)."""
    conn.execute(_SET_SESSION, {"tenant": check_tenant(tenant)})


def bind_tenant_role(conn: psycopg.Connection[Any], role: str, tenant: str | None) -> None:
    """Bind ``role`` to ``tenant`` (None: unbind): its sessions see only that tenant, whatever
    ``pgrag.tenant`` says. Only the owner of pgrag's schema (the migrating role) may."""
    with mapped_database_errors():
        conn.execute("select pgrag.bind_tenant_role(%s, %s)", (role, tenant))


__all__ = [
    "TENANT_SETTING",
    "atenant_scope",
    "bind_tenant_role",
    "check_tenant",
    "set_session_tenant",
    "tenant_scope",
]
