"""`pgrag demo` end to end, as a subprocess: migrate, load 200 customers, render, embed (a
local OpenAI-compatible fake embedder keeps it fast), ask the four questions, print JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import psycopg

from .conftest import PATIENCE_S
from .embed_server import FakeEmbeddings


def test_demo_runs_through_the_cli(db_url: str) -> None:
    fake = FakeEmbeddings()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGRAG_")}
        env |= fake.env() | {"PGRAG_DATABASE_URL": db_url}
        done = subprocess.run(
            [sys.executable, "-c", "from pgrag.cli.search import demo; demo()", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=PATIENCE_S,  # a hang guard, not a speed target
            stdin=subprocess.DEVNULL,
        )
    finally:
        fake.close()
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [a["question"] for a in answers][0] == "What products did John Smith return?"
    assert len(answers) == 4
    john, vips, revenue, maria = answers
    assert "John Smith" in json.dumps(john["filter"])
    returned = re.compile(r"Wireless Mouse x\d+ at \$[\d.]+ \(returned")
    assert any(returned.search(h["text"]) for h in john["retrieved"])
    assert all(h["metadata"]["segment"] == "VIP" for h in vips["retrieved"])
    # "many returns": the VIP customers with the most returns, in order (not the most similar)
    counts = [h["metadata"]["return_count"] for h in vips["retrieved"]]
    assert counts == sorted(counts, reverse=True) and len(counts) == 5
    with psycopg.connect(db_url) as conn:
        most = conn.execute(
            "select (metadata->>'return_count')::int from pgrag.chunks "
            "where doc_type = 'customer_profile' and metadata @> '{\"segment\": \"VIP\"}' "
            "order by 1 desc limit 5"
        ).fetchall()
    assert counts == [r[0] for r in most]
    stats = next(iter(revenue["stats"].values()))
    assert stats["revenue"] > 0 and stats["average_order_value"] > 0
    texts = " ".join(h["text"] for h in maria["retrieved"])
    assert "Yoga Mat" in texts and "Mechanical Keyboard" in texts
    assert {"parse_ms", "embed_ms", "search_ms", "rerank_ms", "generate_ms"} <= set(john["timings"])
