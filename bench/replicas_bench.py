"""Read replicas: search throughput with 0, 1 and 2 hot standbys behind one primary.

    python bench/replicas_bench.py [--rows 100000] [--threads 8] [--seconds 10] [--rounds 3]
                                   [--skip-load] [--replica URL ...]

Against PGRAG_DATABASE_URL (default: the embedded server), in a scratch database
``pgrag_bench_replicas``: ``--rows`` synthetic chunks (pgrag/lab/synthetic.py) with their HNSW
index. Without ``--replica``, two hot standbys of the embedded server are started in temporary
directories (``EmbeddedServer.start_standby``: pg_basebackup, streaming replication on its Unix
socket) and stopped at the end. Then ``--threads`` threads run unfiltered vector searches (k =
10, precomputed query vectors, so no model runs) through one ``pgrag.Client`` for
``--seconds``, with 0 replicas (every read on the primary), 1 and 2, the three interleaved
round by round (the order rotates each round). Prints markdown: searches per second, p50 and
p95, and each configuration's ratio to the primary alone, with the load average.

On one machine every server shares the same cores: replicas add no CPU, so this shows what the
routing costs and that reads spread, not the scale-out a second machine gives
(docs/scaling.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from psycopg import sql

import pgrag
from pgrag import migrate
from pgrag.connection import resolve_url
from pgrag.lab import synthetic
from pgrag.replicas import replayed
from pgrag.server import EmbeddedServer, with_database

DB = "pgrag_bench_replicas"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000 if xs else float("nan")


def run(
    client: pgrag.Client, vecs: list[list[float]], threads: int, seconds: float
) -> tuple[float, list[float]]:
    """(searches per second, latencies) for ``seconds``."""
    stop = threading.Event()
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        i = t
        while not stop.is_set():
            v = vecs[i % len(vecs)]
            i += threads
            started = time.perf_counter()
            try:
                client.search(vector=v, model="synthetic", k=10, mode="vector")
            except BaseException as exc:  # noqa: BLE001 - reported after the run
                errors.append(exc)
                return
            lat[t].append(time.perf_counter() - started)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    started = time.perf_counter()
    for th in pool:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in pool:
        th.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    flat = [x for xs in lat for x in xs]
    return len(flat) / elapsed, flat


def commits(urls: list[str]) -> list[int]:
    """Each server's committed transactions in the database so far (its own statistics)."""
    out = []
    for u in urls:
        with psycopg.connect(u, autocommit=True) as c:
            c.execute("select pg_stat_clear_snapshot()")
            row = c.execute(
                "select xact_commit from pg_stat_database where datname = current_database()"
            ).fetchone()
            out.append(int(row[0]) if row else 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-load", action="store_true", help="keep the scratch database's chunks")
    ap.add_argument("--replica", action="append", default=[], help="a standby's URL (repeat)")
    args = ap.parse_args()

    admin = resolve_url(os.environ.get("PGRAG_DATABASE_URL"))
    url = with_database(admin, DB)
    if not args.skip_load:
        with psycopg.connect(admin, autocommit=True) as a:
            a.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB)))
            a.execute(sql.SQL("create database {}").format(sql.Identifier(DB)))
        migrate.upgrade(url)
        synthetic.load(url, args.rows)

    standbys: list[EmbeddedServer] = []
    scratch: str | None = None
    replica_urls = [with_database(r, DB) for r in args.replica]
    if not replica_urls:
        scratch = tempfile.mkdtemp(prefix="pgrag-bench-replicas-")
        for i in range(2):
            standby = EmbeddedServer(Path(scratch) / f"standby{i}")
            replica_urls.append(with_database(standby.start_standby(admin), DB))
            standbys.append(standby)
    try:

        def client(n: int) -> pgrag.Client:
            return pgrag.connect(
                url, replicas=replica_urls[:n], min_size=args.threads, max_size=args.threads
            )

        with client(2) as c:  # every replica has the loaded store before timing
            c.wrote()
            for r in replica_urls[:2]:
                with psycopg.connect(r) as rc:
                    while not replayed(rc, c.written_lsn or "0/0", 60):
                        pass
        vecs = [v.tolist() for v in synthetic.queries(200)[0]]
        for n in (0, 1, 2):  # warm every server's cache
            with client(n) as c:
                run(c, vecs, args.threads, min(3.0, args.seconds))
        results: dict[int, list[tuple[float, list[float]]]] = {0: [], 1: [], 2: []}
        servers = [url, *replica_urls[:2]]
        served: dict[int, list[int]] = {n: [0] * len(servers) for n in (0, 1, 2)}
        load_before = os.getloadavg()
        for rnd in range(args.rounds):
            order = [(0, 1, 2), (1, 2, 0), (2, 0, 1)][rnd % 3]
            for n in order:
                # a client per run: its connections end with it, and a backend that ends
                # reports its statistics at once (an idle one only after 10 s)
                before = commits(servers)
                with client(n) as c:
                    qps, lat = run(c, vecs, args.threads, args.seconds)
                results[n].append((qps, lat))
                time.sleep(1.0)  # the closed connections' backends exit, and report, meanwhile
                after = commits(servers)
                served[n] = [s + a - b for s, a, b in zip(served[n], after, before, strict=True)]
        load_after = os.getloadavg()
    finally:
        for standby in standbys:
            standby.stop()
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    base = statistics.mean(q for q, _ in results[0])
    print(
        f"`python bench/replicas_bench.py --rows {args.rows} --threads {args.threads} "
        f"--seconds {args.seconds:g} --rounds {args.rounds}`: {os.cpu_count()} cores, load "
        f"average {load_before[0]:.2f} before and {load_after[0]:.2f} after\n"
    )
    print(
        "| replicas | searches/s (mean) | per round | p50 ms | p95 ms | vs primary alone "
        "| transactions on primary / standby 1 / standby 2 |"
    )
    print("|---:|---:|---|---:|---:|---:|---|")
    for n in (0, 1, 2):
        qs = [q for q, _ in results[n]]
        lat = [x for _, xs in results[n] for x in xs]
        mean = statistics.mean(qs)
        print(
            f"| {n} | {mean:,.0f} | {' / '.join(f'{q:,.0f}' for q in qs)} | "
            f"{pct(lat, 0.5):.2f} | {pct(lat, 0.95):.2f} | {mean / base:.2f} | "
            f"{' / '.join(f'{x / max(sum(served[n]), 1):.0%}' for x in served[n])} |"
        )


if __name__ == "__main__":
    main()
