"""SIGKILL the worker, a client or the embedded server at random points, then check recovery.

Used by tests/test_concurrency.py (one round per target) and bench/kills.py (many rounds).
A round starts a writer process (inserts orders with items and updates customers, printing each
order id once its transaction committed) and a worker process (the hash embedder), waits a
random time, SIGKILLs one of the three, restarts what died and checks:

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
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from pgrag.server import EmbeddedServer
from pgrag.worker import Worker

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


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGRAG_")}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _kill(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    return out


def _postmaster_pid(server: EmbeddedServer) -> int:
    return int((server.data_dir / "postmaster.pid").read_text().splitlines()[0])


def restart(server: EmbeddedServer, timeout: float = 60) -> str:
    """Start the server after a SIGKILL (orphaned backends may hold shared memory a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return server.start()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def kill_round(
    server: EmbeddedServer, url: str, target: str, rng: random.Random, stats: KillStats
) -> str:
    """One round on the database at ``url`` (of ``server``); returns ``url``."""
    writer = _spawn(WRITER, url, str(rng.randrange(1, 1000)))
    worker = _spawn(WORKER, url, str(REPO))
    time.sleep(rng.uniform(0.5, 2.5))
    if target == "server":
        os.kill(_postmaster_pid(server), signal.SIGKILL)
        time.sleep(0.2)
    victim = {"worker": worker, "client": writer, "server": writer}[target]
    printed = _kill(victim)
    if target == "server":
        _kill(worker)
        restart(server)  # same data directory, same socket: ``url`` still points at it
    elif target == "worker":
        time.sleep(rng.uniform(0.1, 0.5))  # the writer goes on a little without a worker
        printed = _kill(writer)
    else:
        time.sleep(rng.uniform(0.1, 0.5))
        _kill(worker)
    stats.rounds += 1
    stats.kills[target] += 1
    ids = [int(x) for x in printed.split()]
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
