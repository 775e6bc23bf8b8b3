"""Concurrent writers with pgrag's triggers: transactions per second and latency, by sync mode.

    python bench/writers_bench.py [--customers 2000] [--seconds 15] [--rounds 3] [--clients 1 4]
                                  [--rates 0]

In a scratch database `pgrag_bench_writers` (created and dropped) on PGRAG_DATABASE_URL's
server (default: the embedded one): the sample shop with its documents, then pgbench (shipped
with the embedded server) runs single-row `update shop.order_items set quantity = ... where
order_item_id = <random>` in autocommit, for each mode and client count, interleaved round by
round, the same script and seconds:

  off     pgrag.sync = off: the triggers record nothing (the application without pgrag's render)
  commit  the default: the documents a transaction changed are rendered at its commit
  queue   the triggers record the keys; a worker renders them meanwhile (its render lag, queued
          to rendered, and the queue left at the end are reported)
  commit-worker  (only when asked) commit, each changed chunk's full-text vector left to the
          worker (pgrag.tsvector = worker): off the writer's commit, but a second row version
          of each changed chunk, written by the worker on the same cores
  store   (only when asked: --modes ... store) the floor of any same-transaction design: with
          pgrag.sync = off, the same transaction also updates the two document rows the write
          changes (the order's and its customer's chunk, text changed, embedding cleared) with
          plain UPDATEs: no render, no key query, no lock, no bookkeeping
  render  (only when asked) store's floor plus the render: the two documents' rows written
          from the sample's declared views (the order's and its customer's; the customer found
          by the order's primary key), no lock, no call guard, no bookkeeping, in the write's
          own statement: what a same-transaction design of these documents pays, pgrag's
          machinery aside

With ``--rates``, pgbench offers that many transactions per second in all (``-R``; 0: as many
as the writers can), each rate a run of its own: at a rate the writers can sustain, the queue
mode's render lag and the queue left say whether the worker keeps up with it.

Prints markdown with the load average. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import NoModel, TextIndexer  # noqa: E402
from pgrag import documents, migrate  # noqa: E402
from pgrag.connection import resolve_url  # noqa: E402
from pgrag.lab.sample import load_sample  # noqa: E402
from pgrag.lab.sample_documents import declare_sample_documents  # noqa: E402
from pgrag.server import bin_dir  # noqa: E402
from pgrag.worker import BUSY_POLL_S, Worker  # noqa: E402

DB = "pgrag_bench_writers"
SCRIPT = (
    "\\set id random(1, :max_item)\n"
    "update shop.order_items set quantity = quantity % 9 + 1 where order_item_id = :id;\n"
)


# The store mode's statement: the write and the writes of its two documents' rows, in one
# statement as the write is (no extra round trip), as the commit's store makes them: the text
# changes, so every index takes the new row version, the vector is cleared for the worker and
# the tsvector computed from the new text (as a commit does by default; pgrag.tsvector =
# worker leaves it NULL). The metadata stays as it was (the real store changes it too): a lower
# bound.
def _changed(text: str) -> str:
    """The SET clause of a chunk row written as a render writes a changed document: ``text``
    with one character replaced (:q), its tsvector computed, its vector cleared."""
    changed = f"overlay({text} placing :q::text from 1 for 1)"
    return (
        f"text = {changed}, embedding = null, tsv = pgrag.text_tsvector({changed}), "
        "updated_at = now()"
    )


STORE_SCRIPT = (
    "\\set id random(1, :max_item)\n"
    "\\set q random(0, 9)\n"
    "with i as (update shop.order_items set quantity = quantity % 9 + 1 "
    "where order_item_id = :id returning order_id), "
    f"o as (update pgrag.chunks set {_changed('text')} where doc_type = 'order_detail' "
    "and source_key = (select order_id::text from i)), "
    f"c as (update pgrag.chunks set {_changed('text')} where doc_type = 'customer_profile' "
    "and source_key = (select customer_id::text from shop.orders "
    "where order_id = (select order_id from i))) "
    "select;\n"
)
# The render mode's statement: the store mode's, each document's text and metadata taken from
# its declared view (the sample's, sql/sample/shop_documents.sql) as the commit's render takes
# them. One statement, one snapshot: the views see the row before the write, so the rendered
# text is most often the stored one; one character of it is replaced, as in the store mode, so
# that the row's text and tsvector change as a real render's do (an unchanged row could be
# written as a HOT update, with no index entries: cheaper than any real write). The key query
# is the order's primary-key lookup of its customer.
RENDER_SCRIPT = (
    "\\set id random(1, :max_item)\n"
    "\\set q random(0, 9)\n"
    "with i as (update shop.order_items set quantity = quantity % 9 + 1 "
    "where order_item_id = :id returning order_id), "
    "k as (select o.order_id, o.customer_id from shop.orders o "
    "where o.order_id = (select order_id from i)), "
    f"o as (update pgrag.chunks c set {_changed('d.text')}, metadata = d.metadata "
    "from shop.order_detail_doc d where d.source_key = (select order_id from k) "
    "and c.doc_type = 'order_detail' and c.source_key = d.source_key::text), "
    f"c as (update pgrag.chunks c set {_changed('d.text')}, metadata = d.metadata "
    "from shop.customer_profile_doc d where d.source_key = (select customer_id from k) "
    "and c.doc_type = 'customer_profile' and c.source_key = d.source_key::text) "
    "select;\n"
)


def pgbench(
    url: str, clients: int, seconds: float, mode: str, max_item: int, rate: int = 0
) -> dict[str, float]:
    """One pgbench run: tps and per-transaction latency percentiles (from its log); ``rate``
    transactions per second offered in all (0: unthrottled)."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    env = dict(os.environ)
    env["PGOPTIONS"] = {
        "commit": "",
        "commit-worker": "-c pgrag.tsvector=worker",
        "store": "-c pgrag.sync=off",
        "render": "-c pgrag.sync=off",
    }.get(mode, f"-c pgrag.sync={mode}")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "update.sql"
        script.write_text({"store": STORE_SCRIPT, "render": RENDER_SCRIPT}.get(mode, SCRIPT))
        argv = [
            str(bin_dir() / "pgbench"), "-n", "-M", "prepared", "-c", str(clients),
            "-j", str(clients), "-T", str(int(seconds)), "-f", str(script),
            "-D", f"max_item={max_item}", "-l", "--log-prefix", str(Path(tmp) / "log"),
            "-h", str(info.get("host", "")), "-p", str(info.get("port", 5432)),
            "-U", str(info.get("user", "postgres")), str(info["dbname"]),
            *(["-R", str(rate)] if rate else []),
        ]  # fmt: skip
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
        latencies = sorted(
            int(line.split()[2]) / 1000.0
            for log in Path(tmp).glob("log*")
            for line in log.read_text().splitlines()
        )
    tps = next(float(line.split("=")[1].split()[0]) for line in out.splitlines()
               if line.startswith("tps ="))  # fmt: skip
    return {
        "tps": tps,
        "p50": latencies[len(latencies) // 2],
        "p95": latencies[int(len(latencies) * 0.95)],
        "n": len(latencies),
    }


class RenderWorker:
    """pgrag's worker rendering only (Worker.render_batch: adaptive batches), as fast as the
    queue fills, looking again every 50 ms when it is empty (as the worker does after work)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with Worker(self.url, NoModel()) as w:
            while not self.stop.is_set():
                if w.render_batch() is None:
                    time.sleep(BUSY_POLL_S)

    def __enter__(self) -> RenderWorker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def queue_state(url: str, since: Any) -> dict[str, float]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select (select count(*) from pgrag.render_queue), "
            "percentile_cont(0.5) within group (order by x), "
            "percentile_cont(0.95) within group (order by x), max(x) "
            "from pgrag.render_lag b, unnest(b.lags_ms) x where b.rendered_at >= %s",
            (since,),
        ).fetchone()
    assert row is not None
    return {"left": row[0], "lag_p50": row[1] or 0.0, "lag_p95": row[2] or 0.0,
            "lag_max": row[3] or 0.0}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--customers", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    ap.add_argument(
        "--modes",
        nargs="+",
        default=["off", "commit", "queue"],
        choices=["off", "commit", "commit-worker", "queue", "store", "render"],
    )
    ap.add_argument("--rates", type=int, nargs="+", default=[0], help="offered tx/s (0: all)")
    args = ap.parse_args()

    admin = resolve_url(None)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB)))
        c.execute(sql.SQL("create database {}").format(sql.Identifier(DB)))
    url = psycopg.conninfo.make_conninfo(admin, dbname=DB)
    try:
        migrate.upgrade(url)
        stats = load_sample(url, customers=args.customers, progress=False)
        with psycopg.connect(url, autocommit=True) as conn:
            declare_sample_documents(conn)
            documents.rebuild(conn)
            conn.execute("vacuum analyze")
            max_item = conn.execute("select max(order_item_id) from shop.order_items").fetchone()
        assert max_item is not None
        results: dict[tuple[str, int, int], list[dict[str, float]]] = {}
        # the worker's part in the write path, in every mode (bench/common.py)
        with TextIndexer(url):
            for r in range(args.rounds):
                for rate in args.rates:
                    for clients in args.clients:
                        for mode in args.modes:
                            with psycopg.connect(url) as conn:
                                conn.execute("delete from pgrag.render_queue")  # a run's own
                                conn.commit()
                                since = conn.execute("select clock_timestamp()").fetchone()
                            if mode == "queue":
                                with RenderWorker(url):
                                    out = pgbench(
                                        url, clients, args.seconds, mode, max_item[0], rate
                                    )
                                    out |= queue_state(url, since[0] if since else None)
                            else:
                                out = pgbench(url, clients, args.seconds, mode, max_item[0], rate)
                            results.setdefault((mode, clients, rate), []).append(out)
                            print(
                                f"round {r + 1} {mode} x{clients} rate {rate or 'all'}: "
                                f"{out['tps']:.0f} tps",
                                flush=True,
                            )
        report(args, stats, results)
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB)))


def report(
    args: argparse.Namespace, stats: Any, results: dict[Any, list[dict[str, float]]]
) -> None:
    load = os.getloadavg()
    print(
        f"\nsample: {stats.customers:,} customers, {stats.orders:,} orders, "
        f"{stats.order_items:,} items; {args.rounds} rounds of {args.seconds:.0f} s, "
        f"interleaved; load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
    )
    print("| offered tx/s | mode | writers | tx/s (median of rounds) | p50 ms | p95 ms |"
          " vs off, same writers | render lag p50 / p95 / max ms | queue left |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for rate in args.rates:
        for clients in args.clients:
            base = statistics.median(
                r["tps"] for r in results.get(("off", clients, rate), [{"tps": 0}])
            )
            for mode in args.modes:
                rows = results[(mode, clients, rate)]
                tps = statistics.median(r["tps"] for r in rows)
                lag = (
                    f"{statistics.median(r['lag_p50'] for r in rows):.0f} / "
                    f"{statistics.median(r['lag_p95'] for r in rows):.0f} / "
                    f"{max(r['lag_max'] for r in rows):.0f}"
                    if mode == "queue"
                    else ""
                )
                left = str(int(max(r["left"] for r in rows))) if mode == "queue" else ""
                print(
                    f"| {rate or 'all'} | {mode} | {clients} | {tps:,.0f} | "
                    f"{statistics.median(r['p50'] for r in rows):.2f} | "
                    f"{statistics.median(r['p95'] for r in rows):.2f} | "
                    f"{tps / base if base else 0:.2f} | {lag} | {left} |"
                )
    if len(args.clients) > 1:  # issue 18's scaling target: most writers against fewest
        few, many = min(args.clients), max(args.clients)
        print()
        for rate in args.rates:
            for mode in args.modes:
                by_round = [
                    m["tps"] / f["tps"]
                    for f, m in zip(
                        results[(mode, few, rate)], results[(mode, many, rate)], strict=True
                    )
                ]
                of_medians = statistics.median(
                    r["tps"] for r in results[(mode, many, rate)]
                ) / statistics.median(r["tps"] for r in results[(mode, few, rate)])
                print(
                    f"- {mode}, rate {rate or 'all'}: {many} writers / {few}, the ratio of the "
                    f"median rates: {of_medians:.2f}x (by round "
                    f"{', '.join(f'{x:.2f}' for x in by_round)}; their median "
                    f"{statistics.median(by_round):.2f}x)"
                )


if __name__ == "__main__":
    main()
