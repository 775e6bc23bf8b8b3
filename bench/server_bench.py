"""Embedded server: cold start, warm reuse, connect. Prints a markdown table.

    python bench/server_bench.py [--runs 5]

Cold start = initdb + start + create database in a new data directory (what a newcomer's first
command pays). Warm reuse = a new process finding the running server (pgrag.connect() on it,
pool open, first query). Connect = pgrag.connect() + one query inside an already-warm process.
Each is measured in a fresh subprocess so imports count, as they do for a user.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pgrag.server import EmbeddedServer

TIMED = """
import time, sys
t0 = time.perf_counter()
import pgrag
c = pgrag.connect()
with c.connection() as conn:
    conn.execute("select 1").fetchone()
t1 = time.perf_counter()
c.close()
t2 = time.perf_counter()
c = pgrag.connect()
with c.connection() as conn:
    conn.execute("select 1").fetchone()
t3 = time.perf_counter()
c.close()
print(t1 - t0, t3 - t2)
"""


def run(data: Path) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", TIMED],
        env={"PGRAG_DATA_DIR": str(data), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    cold, warm, connect = [], [], []
    for _ in range(args.runs):
        root = Path(tempfile.mkdtemp(prefix="pgrag-bench-"))
        data = root / "data"
        try:
            t0 = time.perf_counter()
            EmbeddedServer(data).start()
            cold.append(time.perf_counter() - t0)
            w, c = run(data)
            warm.append(w)
            connect.append(c)
        finally:
            EmbeddedServer(data).stop()
            shutil.rmtree(root, ignore_errors=True)

    def row(name: str, xs: list[float], target: str) -> str:
        return (
            f"| {name} | {statistics.median(xs) * 1000:.0f} ms | {max(xs) * 1000:.0f} ms "
            f"| {target} |"
        )

    print(f"runs: {args.runs}\n")
    print("| measure | median | max | target |")
    print("|---|---|---|---|")
    print(row("cold start (initdb + start + create database)", cold, "< 3 s"))
    print(row("warm reuse: new process, import + connect + query", warm, "< 200 ms"))
    print(row("connect + first query in a warm process", connect, "< 200 ms"))


if __name__ == "__main__":
    main()
