"""SIGKILL the worker, a client or the embedded server at random points, then check recovery.

Used by tests/test_concurrency.py (one round per target) and bench/kills.py (many rounds).
A round starts a writer process (inserts orders with items and updates customers, printing each
order id once its transaction committed) and a worker process (the hash embedder), lets them
work a random amount (a number of the writer's commits, and at least one batch the worker
stored: counted, never timed, so that a slow machine kills at the same points as a fast one),
SIGKILLs one of the three, restarts what died and checks:

- every order id the writer printed (committed) is in shop.orders: no committed change lost;
- no chunk holds a vector other than the hash of its current text (none stale but marked done);
- after a worker catches up: ``pgrag.verify`` reports nothing and every chunk has its vector.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psycopg

from pgrag.server import EmbeddedServer
from pgrag.worker import Worker

from .conftest import PATIENCE_S, wait_for
from .hostile import HashEmbedder
from .soak import SoakResult, check_store

REPO = Path(__file__).resolve().parent.parent
TARGETS = ("worker", "client", "server")

WRITER = """
import random, sys, psycopg
url, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
next_id = seed * 1_000_000
with psycopg.connect(url) as conn:
    while True:
        next_id += 2
        with conn.transaction():
            conn.execute(
                "insert into shop.orders values (%s, %s, date '2024-06-01', 'pending')",
                (next_id, rng.choice([1, 2, 3, 101, 102])))
            conn.execute(
                "insert into shop.order_items values (%s, %s, 1, %s, 9.99, 'none')",
                (next_id + 1, next_id, rng.randint(1, 5)))
            conn.execute("update shop.customers set name = %s where customer_id = %s",
                         (f"Kill Name {rng.randrange(100)}", rng.choice([1, 2, 101])))
        print(next_id, flush=True)
"""

WORKER = """
import sys
sys.path.insert(0, sys.argv[2])
from tests.hostile import HashEmbedder
from pgrag.worker import Worker
with Worker(sys.argv[1], HashEmbedder(), batch_size=4) as w:
    w.run_forever(poll_s=0.2)
"""


@dataclass
class KillStats:
    rounds: int = 0
    kills: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0))
    committed: int = 0  # orders the writers saw commit
    lost: int = 0  # of which missing afterwards
    stale_marked_fresh: int = 0
    mismatches: int = 0
    missing_vectors: int = 0
    wrong_vectors: int = 0


class _Child:
    """A child process whose stdout lines a thread collects as they come."""

    def __init__(self, code: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGRAG_")}
        # read only to explain a child that ended; closed by kill()
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for_lines(self, n: int, what: str) -> None:
        wait_for(lambda: len(self.lines) >= n or self.proc.poll() is not None, what)
        if len(self.lines) < n:
            self.stderr.seek(0)
            tail = self.stderr.read().decode(errors="replace")[-2000:]
            raise AssertionError(f"{what}: the child ended ({self.proc.returncode}): {tail}")

    def kill(self) -> list[str]:
        """SIGKILL (unless it ended already); every line it printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(PATIENCE_S)
        self._reader.join(PATIENCE_S)  # the pipe's end: every line is in
        self.stderr.close()
        return self.lines


def _postmaster_pid(server: EmbeddedServer) -> int:
    return int((server.data_dir / "postmaster.pid").read_text().splitlines()[0])


def restart(server: EmbeddedServer, patience_s: float = PATIENCE_S) -> str:
    """Start the server after a SIGKILL (orphaned backends may hold shared memory a moment)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return server.start()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _stored_since(url: str, since: datetime) -> int:
    """Vectors stored at or after ``since`` (the database's clock)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select count(*) from pgrag.chunks where embedded_at >= %s", (since,)
        ).fetchone()
    return int(row[0]) if row else 0


def _nothing_to_embed(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("select count(*) from pgrag.chunks where embedding is null").fetchone()
    return row is not None and row[0] == 0


def _now(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        row = conn.execute("select clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def kill_round(
    server: EmbeddedServer, url: str, target: str, rng: random.Random, stats: KillStats
) -> str:
    """One round on the database at ``url`` (of ``server``); returns ``url``."""
    started = _now(url)
    writer = _Child(WRITER, url, str(rng.randrange(1, 1000)))
    worker = _Child(WORKER, url, str(REPO))
    # the kill point, in work done: some commits of the writer, some vectors of the worker
    writer.wait_for_lines(rng.randint(3, 40), "the writer committed its orders")
    wait_for(lambda: _stored_since(url, started) > 0, "the worker stored a batch")
    if target == "server":
        os.kill(_postmaster_pid(server), signal.SIGKILL)
    victim = {"worker": worker, "client": writer, "server": writer}[target]
    printed = victim.kill()
    if target == "server":
        worker.kill()
        restart(server)  # same data directory, same socket: ``url`` still points at it
    elif target == "worker":
        # the writer goes on a little without a worker
        writer.wait_for_lines(len(writer.lines) + rng.randint(1, 10), "the writer went on")
        printed = writer.kill()
    else:
        # the worker goes on a little without the writer: one more batch, or it caught up
        since = _now(url)
        wait_for(
            lambda: _stored_since(url, since) > 0 or _nothing_to_embed(url),
            "the worker stored another batch or caught up",
        )
        worker.kill()
    stats.rounds += 1
    stats.kills[target] += 1
    ids = [int(x) for x in printed if x.endswith("\n")]  # (not a line cut by the kill)
    stats.committed += len(ids)
    with psycopg.connect(url) as conn:
        present = conn.execute(
            "select count(*) from shop.orders where order_id = any(%s)", (ids,)
        ).fetchone()
    stats.lost += len(ids) - int(present[0] if present else 0)
    before = SoakResult()
    check_store(url, before)  # before catching up: vectors present must match their text
    stats.stale_marked_fresh += before.wrong_vectors
    with Worker(url, HashEmbedder(), batch_size=64) as w:
        w.drain()
    after = SoakResult()
    check_store(url, after)
    stats.mismatches += len(after.mismatches)
    stats.missing_vectors += after.missing_vectors
    stats.wrong_vectors += after.wrong_vectors
    return url
