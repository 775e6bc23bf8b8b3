"""Read replicas: which server a read goes to, and whether it has the caller's last write.

PostgreSQL's own streaming replicas carry pgrag as they carry any table: the chunks, their
links and vectors, the settings and every function arrive by replication, and the triggers and
the worker run on the primary only. The client (``pgrag.db.Client``) sends writes,
declarations and the worker's work to the primary and its reads (search, statistics, context,
ask) to the replicas in turn. This module is the part of that with no pool in it:

* ``split_url``: a libpq multi-host URL (``host=a,b,c``) as a writer URL
  (``target_session_attrs=read-write``: libpq finds the primary) and one reader URL per host
  (``target_session_attrs=standby``: the host that is the primary refuses it);
* ``Rotation``: round robin over the replicas, skipping one marked down until its back-off
  ends (1 s, doubling to 30 s while it keeps failing);
* ``is_server_failure``: whether a read's error says the server went away or cannot serve it
  (try the next one) rather than that the read itself is wrong (raise it);
* read-your-writes: ``WRITTEN_LSN`` on the primary after the caller's write (``commit_lsn``),
  then ``replayed`` / ``areplayed`` on a replica wait until it has replayed that far, or say
  it did not within the time given (the caller then reads from the primary).

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
# A replica that does not answer a direct connection within this is down.
CONNECT_TIMEOUT_S = 2
# A read waits this long for a free connection of a replica's pool, then asks the server
# directly: down (skipped, back-off) or busy (the read goes on to the next server).
REPLICA_CONNECT_S = 0.5

# The primary's WAL insert position: at or after the end of every transaction committed before
# it was read (a commit record is inserted before the commit returns).
WRITTEN_LSN: LiteralString = "select pg_current_wal_insert_lsn()::text"
# Whether this server has everything up to an LSN: a standby that replayed that far, or a
# primary (a multi-host reader URL may land on it).
_REPLAYED: LiteralString = (
    "select not pg_is_in_recovery() or pg_last_wal_replay_lsn() >= %s::pg_lsn"
)

# What says that the server, not the read, failed: a broken connection; SQLSTATE class 08
# (connection exception); 57P01-57P05 (shut down, crashed, not accepting connections, database
# dropped, idle session timeout); and, on a standby (reads only go to standbys), 40001 and
# 40P01: a read cancelled for a conflict with recovery (a standby cannot run SERIALIZABLE, so
# 40001 there is always that). Never 57014: a statement timeout or a cancel is the read's own,
# and would cost as much again on the next server.
_SERVER_STATES = ("57P01", "57P02", "57P03", "57P04", "57P05", "40001", "40P01")


def hosts(url: str) -> list[str]:
    """The hosts of a libpq URL or conninfo string (several in a multi-host URL)."""
    host = str(conninfo.conninfo_to_dict(url).get("host") or "")
    return [h for h in host.split(",") if h] or [""]


def split_url(url: str) -> tuple[str, list[str]]:
    """(writer URL, reader URLs): a multi-host URL as libpq's read-write target (libpq finds
    the primary among the hosts, wherever it is after a failover) and one reader URL per host
    with ``target_session_attrs=standby`` (a host that is the primary refuses it, and is
    skipped as down); a single-host URL unchanged, with no reader."""
    params = conninfo.conninfo_to_dict(url)
    names = hosts(url)
    if len(names) < 2:
        return url, []
    ports = str(params.get("port") or "").split(",")
    params.pop("load_balance_hosts", None)
    writer = dict(params, target_session_attrs="read-write")
    readers = []
    for i, host in enumerate(names):
        one = dict(params, host=host, target_session_attrs="standby")
        if params.get("port"):
            one["port"] = ports[i] if len(ports) == len(names) else ports[0]
        readers.append(conninfo.make_conninfo(**one))  # type: ignore[arg-type]
    return conninfo.make_conninfo(**writer), readers  # type: ignore[arg-type]


class Rotation:
    """Round robin over ``n`` replicas, skipping those marked down. Thread-safe."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._next = 0
        self._down_until = [0.0] * n
        self._backoff = [0.0] * n
        self._lock = threading.Lock()

    def order(self) -> list[int]:
        """The replicas to try for one read, each once, the next in turn first; those down
        are left out until their back-off ends."""
        now = time.monotonic()
        with self._lock:
            start = self._next
            self._next = (self._next + 1) % max(self._n, 1)
            ring = [(start + i) % self._n for i in range(self._n)]
            return [i for i in ring if self._down_until[i] <= now]

    def down(self, i: int) -> None:
        """Leave replica i out for its back-off: 1 s, doubling to 30 s while it fails again
        once back. Several reads failing at once on one replica count once."""
        with self._lock:
            now = time.monotonic()
            if self._down_until[i] > now:
                return
            self._backoff[i] = min(DOWN_MAX_S, max(DOWN_FIRST_S, self._backoff[i] * 2))
            self._down_until[i] = now + self._backoff[i]

    def up(self, i: int) -> None:
        with self._lock:
            self._backoff[i] = 0.0
            self._down_until[i] = 0.0


def is_server_failure(
    exc: BaseException, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None
) -> bool:
    """Whether a read on a standby failed because of its server (gone, shutting down, in
    conflict with replay), so that another server may answer it; False for an error of the
    read itself (a bad filter, a statement timeout, a cancel)."""
    if conn is not None and (conn.broken or conn.closed):
        return True
    # the error, what it was raised from, and what it was raised while handling: a pipeline
    # the server left mid-way raises "cannot exit pipeline mode while busy" over the server's
    # own shutdown error
    todo: list[BaseException] = [exc]
    walked: set[int] = set()  # (a cause may lead back: never walk one twice)
    while todo:
        seen = todo.pop()
        if id(seen) in walked:
            continue
        walked.add(id(seen))
        if isinstance(seen, psycopg.Error):
            state = seen.sqlstate or ""
            if state.startswith("08") or state in _SERVER_STATES:
                return True
        todo += [e for e in (seen.__cause__, seen.__context__) if e is not None]
    return False


def failures(stats: dict[str, int]) -> int:
    """A pool's failed and lost connections so far (``get_stats``): when it grew since the
    last look, the server may be gone, and a read asks it directly (``answers``) before
    waiting for the pool."""
    return stats.get("connections_errors", 0) + stats.get("connections_lost", 0)


def answers(url: str) -> bool:
    """Whether a replica's server accepts a connection now (one plain connection; a server
    that is down refuses it at once, an unreachable host takes CONNECT_TIMEOUT_S)."""
    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S):
            return True
    except psycopg.Error:
        return False


async def aanswers(url: str) -> bool:
    """``answers`` on asyncio."""
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error:
        return False
    await conn.close()
    return True


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


_WAL_PAGE = 8192
# A WAL page's header: 24 bytes, 40 on a segment's first page
_PAGE_HEADERS = (24, 40)


def _value(lsn: str) -> int:
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def commit_lsn(insert_lsn: str) -> str:
    """What a standby must have replayed to hold every commit before ``insert_lsn`` (the
    primary's insert position read after them): that position, or, when it sits right after
    a page header (nothing written on the page yet), the page's start, where the last record
    ended. A standby's replay position never passes a header no record follows, so waiting
    for the insert position itself would wait until the next write."""
    value = _value(insert_lsn)
    if value % _WAL_PAGE in _PAGE_HEADERS:
        value -= value % _WAL_PAGE
    return _text(value)


def later_lsn(a: str | None, b: str | None) -> str | None:
    """The later of two LSNs ('16/B374D848'), either may be None."""
    if a is None or b is None:
        return a or b
    return a if _value(a) >= _value(b) else b


def check_urls(replicas: Sequence[str]) -> list[str]:
    """The replica URLs, each a connection string libpq can read (a one-line error
    otherwise). Whether each answers is seen at the first read (one that does not is skipped,
    with a warning from the pool)."""
    from pgrag.errors import ConfigError

    out = []
    for url in replicas:
        problem = "it is empty"
        if isinstance(url, str) and url.strip():
            try:
                conninfo.conninfo_to_dict(url)
                out.append(url)
                continue
            except psycopg.ProgrammingError as exc:
                problem = str(exc).splitlines()[0]
        raise ConfigError(
            f"replica URL {url!r} is not a connection string ({problem}): pass each replica "
            "as postgresql://USER@HOST:PORT/DBNAME"
        )
    return out


class Reads:
    """What a client knows about its replicas, whichever client (sync or asyncio) holds the
    pools: the writer URL and the replica URLs (``split_url``, ``check_urls``), the rotation,
    each pool's failures seen so far, and the caller's last write. Thread-safe."""

    def __init__(
        self, url: str, replicas: Sequence[str], read_your_writes: bool, replay_wait_s: float
    ) -> None:
        self.writer, hosts_ = split_url(url)
        self.urls = check_urls(replicas) or hosts_
        self.read_your_writes = read_your_writes
        self.replay_wait_s = replay_wait_s
        self.rotation = Rotation(len(self.urls))
        self._failures = [0] * len(self.urls)
        self._written: str | None = None
        self._unknown = False  # a write whose position could not be read
        self._lock = threading.Lock()

    def remember(self, insert_lsn: str) -> None:
        """A write of the caller's, at the primary's insert position read after it."""
        with self._lock:
            self._written = later_lsn(self._written, commit_lsn(insert_lsn))
            self._unknown = False

    def lost(self) -> None:
        """A write whose position could not be read: fresh reads go to the primary until the
        next write's position is remembered."""
        with self._lock:
            self._unknown = True

    @property
    def written(self) -> str | None:
        with self._lock:
            return self._written

    def wanted(self, read_your_writes: bool | None) -> tuple[bool, str | None]:
        """(whether a replica may serve the read, the LSN it must have replayed or None)."""
        fresh = self.read_your_writes if read_your_writes is None else read_your_writes
        if not fresh:
            return True, None
        with self._lock:
            return not self._unknown, self._written

    def pool_failed(self, i: int, stats: dict[str, int]) -> bool:
        """Whether replica i's pool failed or lost connections since the last look: its
        server may be gone, and a read asks it directly before waiting for the pool."""
        seen = failures(stats)
        with self._lock:
            if seen <= self._failures[i]:
                return False
            self._failures[i] = seen
            return True
