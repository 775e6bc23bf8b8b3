"""Time `pgrag sample load` at 100,000 customers (~1M orders, ~2.5M order items).

    python bench/sample_load_bench.py                  # a throwaway embedded server
    python bench/sample_load_bench.py --database-url URL   # replaces schema shop there!

Prints one markdown table row per run and a summary row (the median), for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from pathlib import Path

import psycopg

from pgrag.lab.sample import SampleStats, load_sample

HEADER = (
    "| customers | orders | order items | load (s) | rows/s | database size | machine |\n"
    "|---:|---:|---:|---:|---:|---:|---|"
)


def machine() -> str:
    return f"{os.cpu_count()} CPU, {platform.machine()}, Python {platform.python_version()}"


def row(stats: SampleStats, size: str, label: str = "") -> str:
    total = stats.customers + stats.products + stats.orders + stats.order_items
    return (
        f"| {stats.customers:,} | {stats.orders:,} | {stats.order_items:,} | "
        f"{stats.elapsed_s:.1f}{label} | {total / stats.elapsed_s:,.0f} | {size} | {machine()} |"
    )


def database_size(url: str) -> str:
    with psycopg.connect(url) as conn:
        got = conn.execute(
            "select pg_size_pretty(sum(pg_total_relation_size(c.oid))) from pg_class c "
            "where c.relnamespace = 'shop'::regnamespace and c.relkind = 'r'"
        ).fetchone()
    return str(got[0]) if got else "?"


def run(url: str, customers: int, seed: int, repeat: int) -> None:
    print(HEADER)
    runs = []
    for _ in range(repeat):
        stats = load_sample(url, customers=customers, seed=seed, progress=False)
        runs.append(stats)
        print(row(stats, database_size(url)), flush=True)
    median = sorted(runs, key=lambda s: s.elapsed_s)[len(runs) // 2]
    print(f"\nmedian of {repeat}:")
    print(HEADER)
    print(row(median, database_size(url), " (median)"))
    print(f"min {min(s.elapsed_s for s in runs):.1f} s, "
          f"spread {statistics.pstdev(s.elapsed_s for s in runs):.1f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--database-url",
        help="load there (drops schema shop!); default: a throwaway embedded server",
    )
    args = parser.parse_args()
    if args.database_url:
        run(args.database_url, args.customers, args.seed, args.repeat)
        return
    from pgrag.server import EmbeddedServer

    with tempfile.TemporaryDirectory(prefix="pgrag-bench-") as tmp:
        server = EmbeddedServer(Path(tmp) / "pg")
        url = server.start()
        try:
            run(url, args.customers, args.seed, args.repeat)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
