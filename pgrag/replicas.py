"""Read replicas: which server a read goes to, and whether it has the caller's last write.

PostgreSQL's own streaming replicas carry pgrag as they carry any table: the chunks, their
links and vectors, the settings and every function arrive by replication, and the triggers and
the worker run on the primary only. The client (``pgrag.db.Client``) sends writes,
declarations and the worker's work to the primary and its reads (search, statistics, context,
ask) to the replicas in turn. This module is the part of that with no pool in it:

* ``split_url``: a libpq multi-host URL (``host=a,b,c``) as a writer URL
  (``target_session_attrs=read-write``: libpq finds the primary) and a reader URL
  (``prefer-standby`` with ``load_balance_hosts=random``: libpq spreads the reads over the
  standbys and takes the primary when none answers);
* ``Rotation``: round robin over the replicas, skipping one marked down until its back-off
  ends (1 s, doubling to 30 s while it keeps failing);
* ``is_server_failure``: whether a read's error says the server went away or cannot serve it
  (try the next one) rather than that the read itself is wrong (raise it);
* read-your-writes: ``WRITTEN_LSN`` on the primary after the caller's write, then
  ``replayed`` / ``areplayed`` on a replica wait until it has replayed that far, or say it
  did not within the time given (the caller then reads from the primary).

docs/scaling.md says when to add replicas and what each of pgrag's pieces does on them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any, LiteralString

import psycopg
from psycopg import conninfo

# Back-off for a replica that failed: the first retry after 1 s, doubling while it fails.
DOWN_FIRST_S = 1.0
DOWN_MAX_S = 30.0
# How long a read waits for a replica to replay the caller's last write before it reads from
# the primary instead (read_your_writes), and for a replica's connection.
REPLAY_WAIT_S = 1.0
REPLICA_CONNECT_S = 2.0

# The primary's WAL insert position: at or after the end of every transaction committed before
# it was read (a commit record is inserted before the commit returns).
WRITTEN_LSN: LiteralString = "select pg_current_wal_insert_lsn()::text"
# Whether this server has everything up to an LSN: a standby that replayed that far, or a
# primary (a multi-host reader URL may land on it).
_REPLAYED: LiteralString = (
    "select not pg_is_in_recovery() or pg_last_wal_replay_lsn() >= %s::pg_lsn"
)

# SQLSTATE classes that mean the server, not the read: 08 connection exception, 57 operator
# intervention (a shutdown, a crash); and a standby cancelling a read that conflicts with
# replay (40001 with this message, the only way to tell it from a serialization failure).
_SERVER_CLASSES = ("08", "57")
_RECOVERY_CONFLICT = "conflict with recovery"


def hosts(url: str) -> list[str]:
    """The hosts of a libpq URL or conninfo string (several in a multi-host URL)."""
    host = str(conninfo.conninfo_to_dict(url).get("host") or "")
    return [h for h in host.split(",") if h] or [""]


def split_url(url: str) -> tuple[str, str | None]:
    """(writer URL, reader URL or None): a multi-host URL as libpq's read-write and
    prefer-standby targets; a single-host URL unchanged, with no reader."""
    if len(hosts(url)) < 2:
        return url, None
    params = conninfo.conninfo_to_dict(url)
    params.pop("load_balance_hosts", None)
    writer = dict(params, target_session_attrs="read-write")
    reader = dict(params, target_session_attrs="prefer-standby", load_balance_hosts="random")
    return conninfo.make_conninfo(**writer), conninfo.make_conninfo(**reader)  # type: ignore[arg-type]


class Rotation:
    """Round robin over ``n`` replicas, skipping those marked down. Thread-safe."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._next = 0
        self._down_until = [0.0] * n
        self._backoff = [0.0] * n
        self._lock = threading.Lock()

    def order(self) -> list[int]:
        """The replicas to try for one read, the next in turn first; those down are left out
        until their back-off ends."""
        now = time.monotonic()
        with self._lock:
            start = self._next
            self._next = (self._next + 1) % max(self._n, 1)
            ring = [(start + i) % self._n for i in range(self._n)]
            return [i for i in ring if self._down_until[i] <= now]

    def down(self, i: int) -> None:
        with self._lock:
            self._backoff[i] = min(DOWN_MAX_S, max(DOWN_FIRST_S, self._backoff[i] * 2))
            self._down_until[i] = time.monotonic() + self._backoff[i]

    def up(self, i: int) -> None:
        with self._lock:
            self._backoff[i] = 0.0
            self._down_until[i] = 0.0

    def is_down(self, i: int) -> bool:
        with self._lock:
            return self._down_until[i] > time.monotonic()


def is_server_failure(
    exc: BaseException, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None
) -> bool:
    """Whether a read failed because of its server (gone, shutting down, in conflict with
    replay), so that another server may answer it; False for an error of the read itself."""
    if conn is not None and conn.broken:
        return True
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, psycopg.Error):
            state = seen.sqlstate or ""
            if state[:2] in _SERVER_CLASSES:
                return True
            if state == "40001" and _RECOVERY_CONFLICT in str(seen):
                return True
            if state == "" and isinstance(seen, psycopg.OperationalError):
                return True  # no SQLSTATE: the connection itself failed
        seen = seen.__cause__
    return False


def replayed(conn: psycopg.Connection[Any], lsn: str, wait_s: float) -> bool:
    """Whether the server of ``conn`` has replayed up to ``lsn``, waiting up to ``wait_s``
    (polling: from 1 ms, doubling to 20 ms). Runs outside any transaction it leaves open."""
    deadline = time.monotonic() + wait_s
    pause = 0.001
    while True:
        row = conn.execute(_REPLAYED, (lsn,)).fetchone()
        if row is not None and row[0]:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


async def areplayed(conn: psycopg.AsyncConnection[Any], lsn: str, wait_s: float) -> bool:
    """``replayed`` on an async connection."""
    deadline = time.monotonic() + wait_s
    pause = 0.001
    while True:
        cur = await conn.execute(_REPLAYED, (lsn,))
        row = await cur.fetchone()
        if row is not None and row[0]:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.02)


def later_lsn(a: str | None, b: str | None) -> str | None:
    """The later of two LSNs ('16/B374D848'), either may be None."""
    if a is None or b is None:
        return a or b

    def value(lsn: str) -> int:
        hi, lo = lsn.split("/")
        return (int(hi, 16) << 32) | int(lo, 16)

    return a if value(a) >= value(b) else b


def check_urls(replicas: Sequence[str]) -> list[str]:
    """The replica URLs, each a string (a one-line error otherwise)."""
    from pgrag.errors import ConfigError

    out = []
    for url in replicas:
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(
                f"replica URL {url!r} is not a connection string: pass each replica as "
                "postgresql://USER@HOST:PORT/DBNAME"
            )
        out.append(url)
    return out
