"""Many writers on the sample shop while workers embed; then everything must agree.

Used by tests/test_concurrency.py (a short run) and bench/soak.py (long runs, figures in
docs/reliability.md). Writers are threads running random transactions on shop.customers,
shop.orders and shop.order_items (one to three statements each, tables in random order); workers
are threads draining the queue with the hash embedder. A deadlock (SQLSTATE 40P01) is counted,
never retried. Afterwards: drain, ``pgrag.verify`` must report nothing and every chunk must hold
the hash embedder's vector of its current text.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from pgrag import documents
from pgrag.worker import Worker, as_vector

from .conftest import PATIENCE_S, wait_for
from .hostile import HashEmbedder, hash_vector
from .shop_fixture import load_tiny_shop

SEGMENTS = ("VIP", "Regular", "New", "Dormant")
STATUSES = ("pending", "processing", "shipped", "delivered", "cancelled")
RETURNS = ("none", "requested", "completed")
EXTRA_CUSTOMERS = 20


def prepare_shop(url: str) -> None:
    """The tiny shop, plus a few more customers (few customers: writers collide often)."""
    with psycopg.connect(url) as conn:
        load_tiny_shop(conn)
        conn.execute(
            "insert into shop.customers select 100 + i, 'Soak Customer ' || i, "
            "'soak' || i || '@example.com', 'Regular', date '2024-01-01', null, null "
            "from generate_series(1, %s) i",
            (EXTRA_CUSTOMERS,),
        )


@dataclass
class SoakResult:
    seconds: float = 0.0
    writers: int = 0
    max_statements: int = 1
    sync: str = "commit"  # pgrag.sync of the writers: commit (the default), queue, immediate
    workers: int = 0
    transactions: int = 0
    statements: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    deadlocks: int = 0
    deadlock_details: list[str] = field(default_factory=list)  # PostgreSQL's DETAIL, CONTEXT
    # of them, cycles through a document (advisory) lock: pgrag's; the rest are row-lock
    # cycles between the writers' own statements, which exist without pgrag too
    document_lock_deadlocks: int = 0
    other_errors: list[str] = field(default_factory=list)
    embedded: int = 0
    chunks: int = 0
    mismatches: list[Any] = field(default_factory=list)
    wrong_vectors: int = 0
    missing_vectors: int = 0


def _one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query.encode() if params is None else query, params).fetchone()
    return row[0] if row else None


class _Writer:
    def __init__(
        self, url: str, index: int, seed: int, result: SoakResult, max_statements: int
    ) -> None:
        self.url = url
        self.max_statements = max_statements
        self.rng = random.Random(seed * 1000 + index)
        self.next_id = (index + 1) * 1_000_000
        self.result = result

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def customer(self, conn: psycopg.Connection[Any]) -> int:
        return int(_one(conn, "select customer_id from shop.customers order by random() limit 1"))

    def order(self, conn: psycopg.Connection[Any]) -> int | None:
        v = _one(conn, "select order_id from shop.orders order by random() limit 1")
        return None if v is None else int(v)

    def item(self, conn: psycopg.Connection[Any]) -> int | None:
        v = _one(conn, "select order_item_id from shop.order_items order by random() limit 1")
        return None if v is None else int(v)

    # ---- the statements ----

    def customer_segment(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "update shop.customers set segment = %s where customer_id = %s",
            (self.rng.choice(SEGMENTS), self.customer(conn)),
        )

    def customer_name(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "update shop.customers set name = %s where customer_id = %s",
            (f"Name {self.rng.randrange(1000)}", self.customer(conn)),
        )

    def new_order(self, conn: psycopg.Connection[Any]) -> None:
        oid = self.new_id()
        conn.execute(
            "insert into shop.orders values (%s, %s, date '2024-01-01' + %s, %s)",
            (oid, self.customer(conn), self.rng.randrange(365), self.rng.choice(STATUSES)),
        )
        for _ in range(self.rng.randint(1, 3)):
            conn.execute(
                "insert into shop.order_items values (%s, %s, %s, %s, %s, 'none')",
                (self.new_id(), oid, self.rng.randint(1, 3), self.rng.randint(1, 4), 10.5),
            )

    def order_status(self, conn: psycopg.Connection[Any]) -> None:
        oid = self.order(conn)
        if oid is not None:
            conn.execute(
                "update shop.orders set status = %s where order_id = %s",
                (self.rng.choice(STATUSES), oid),
            )

    def move_order(self, conn: psycopg.Connection[Any]) -> None:
        oid = self.order(conn)
        if oid is not None:
            conn.execute(
                "update shop.orders set customer_id = %s where order_id = %s",
                (self.customer(conn), oid),
            )

    def item_change(self, conn: psycopg.Connection[Any]) -> None:
        iid = self.item(conn)
        if iid is not None:
            conn.execute(
                "update shop.order_items set return_status = %s, quantity = %s "
                "where order_item_id = %s",
                (self.rng.choice(RETURNS), self.rng.randint(1, 5), iid),
            )

    def delete_item(self, conn: psycopg.Connection[Any]) -> None:
        iid = self.item(conn)
        if iid is not None:
            conn.execute("delete from shop.order_items where order_item_id = %s", (iid,))

    def delete_order(self, conn: psycopg.Connection[Any]) -> None:
        oid = self.order(conn)
        if oid is not None:
            conn.execute("delete from shop.orders where order_id = %s", (oid,))

    def ops(self) -> list[Callable[[psycopg.Connection[Any]], None]]:
        return [
            self.customer_segment,
            self.customer_name,
            self.new_order,
            self.new_order,
            self.order_status,
            self.move_order,
            self.item_change,
            self.item_change,
            self.delete_item,
            self.delete_order,
        ]

    def run(self, stop: threading.Event) -> None:
        ops = self.ops()
        with psycopg.connect(self.url) as conn:
            # a lost wakeup fails loudly instead of hanging (a guard, not a speed target)
            conn.execute("select set_config('lock_timeout', %s, false)", (f"{PATIENCE_S:.0f}s",))
            if self.result.sync != "commit":  # immediate: per statement; queue: by the workers
                conn.execute("select set_config('pgrag.sync', %s, false)", (self.result.sync,))
            conn.commit()
            while not stop.is_set():
                chosen = [
                    self.rng.choice(ops) for _ in range(self.rng.randint(1, self.max_statements))
                ]
                try:
                    with conn.transaction():
                        for op in chosen:
                            op(conn)
                except psycopg.errors.DeadlockDetected as exc:
                    self.result.deadlocks += 1
                    if "advisory lock" in (exc.diag.message_detail or ""):
                        self.result.document_lock_deadlocks += 1
                    self.result.deadlock_details.append(
                        f"{exc.diag.message_detail}\n{exc.diag.context}"[:3000]
                    )
                    continue
                except psycopg.Error as exc:
                    self.result.other_errors.append(
                        f"{type(exc).__name__}: {exc} {exc.diag.message_detail} {exc.diag.context}"[
                            :3000
                        ]
                    )
                    continue
                self.result.transactions += 1
                self.result.statements += len(chosen)
                self.result.ops.update(op.__name__ for op in chosen)


def run_soak(
    url: str,
    *,
    writers: int,
    workers: int,
    transactions: int | None = None,
    seconds: float | None = None,
    seed: int = 1,
    max_statements: int = 1,
    sync: str = "commit",
) -> SoakResult:
    """Writers and workers until the writers committed ``transactions`` (the test suite: a
    count of work, whatever the machine's speed) or for ``seconds`` (bench/reliability.py);
    then drain and check (the shop must be loaded). Either way every worker has rendered or
    embedded at least one batch while the writers ran.

    ``sync="immediate"`` makes the writers render per statement (``set pgrag.sync =
    immediate``), as every writer did before revision 0007: the deadlocks that made commit-time
    rendering the default. ``sync="queue"``: the writers only record what changed and the
    workers render it."""
    assert (transactions is None) != (seconds is None), "give transactions or seconds"
    result = SoakResult(writers=writers, workers=workers, max_statements=max_statements, sync=sync)
    stop = threading.Event()
    embedder = HashEmbedder()
    written: list[int] = []
    batches = [0] * workers  # render and embedding batches of each worker

    def work(index: int) -> None:
        def count(_: object) -> None:
            batches[index] += 1

        with Worker(url, embedder, batch_size=8, stop=stop) as w:
            while not stop.is_set():
                r = w.drain(on_batch=count, on_render=count)
                written.append(r.written)
                if r.claimed == 0 and r.rendered_entries == 0:
                    time.sleep(0.05)  # an idle worker's poll, not a wait for anything

    threads = [
        threading.Thread(target=_Writer(url, i, seed, result, max_statements).run, args=(stop,))
        for i in range(writers)
    ] + [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    started = time.perf_counter()
    for t in threads:
        t.start()

    def enough() -> bool:
        if not all(t.is_alive() for t in threads):
            return True  # a thread died: stop the others, fail below
        if len(result.other_errors) >= 100:
            return True  # something is broken; the caller sees the errors
        if seconds is not None:
            done = time.perf_counter() - started >= seconds
        else:
            done = result.transactions >= (transactions or 0)
        return done and min(batches, default=1) > 0

    dead: list[str] = []
    try:
        try:
            wait_for(enough, f"{transactions} writer transactions and a batch of each worker")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: {result.transactions} transactions, worker batches {batches}"
            ) from None
        dead = [t.name for t in threads if not t.is_alive()]
    finally:
        stop.set()
        for t in threads:
            t.join(PATIENCE_S)
    assert not any(t.is_alive() for t in threads), "a writer or worker did not stop"
    assert not dead, f"{dead} ended before the others (traceback above)"
    with Worker(url, embedder, batch_size=64) as w:
        written.append(w.drain().written)
    result.seconds = time.perf_counter() - started
    result.embedded = sum(written)
    check_store(url, result)
    return result


def check_store(url: str, result: SoakResult) -> None:
    """Fill in mismatches (verify) and wrong / missing vectors of ``result``."""
    with psycopg.connect(url) as conn:
        register_vector(conn)
        result.mismatches = documents.verify(conn)
        rows = conn.execute("select text, embedding from pgrag.chunks").fetchall()
    result.chunks = len(rows)
    for text, embedding in rows:
        if embedding is None:
            result.missing_vectors += 1
        elif not np.allclose(as_vector(embedding), hash_vector(text), atol=1e-6):
            result.wrong_vectors += 1
