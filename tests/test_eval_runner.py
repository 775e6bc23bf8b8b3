"""pgrag.lab.eval.runner and the eval CLI, on the tiny shop with the real default model: rankings
credited by the documented rule, metrics, stored rows, JSON output, errors; and the strategy
benchmark on the tiny shop."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgvector.psycopg import register_vector

from pgrag.answer import LLMConfig
from pgrag.errors import ConfigError
from pgrag.lab.eval.bench import embed_type, markdown, run_strategy_bench
from pgrag.lab.eval.faithfulness import JUDGE_PROMPT
from pgrag.lab.eval.metrics import evaluate
from pgrag.lab.eval.questions import Question, Relevant, labels, qrels, write_jsonl
from pgrag.lab.eval.runner import (
    SHOP_ENTITIES,
    belongs_to,
    credit,
    list_runs,
    run_eval,
    store_run,
)
from pgrag.lab.sample_documents import declare_sample_documents
from pgrag.search import SearchHit
from pgrag.vocabulary import forget_vocabulary

from .chat_server import ChatServer, Reply
from .conftest import create_database, drop_database, run_pgrag
from .embed_server import default_embedder
from .shop_fixture import load_tiny_shop

QUESTIONS = [
    Question(
        "returns-001",
        "What did John Smith return?",
        "Wireless Mouse (completed, order 10)",
        (Relevant("customer_profile", "1"), Relevant("order_detail", "10")),
        "simple",
        "returns",
    ),
    Question(
        "status-001",
        "What is the status of order 20?",
        "delivered",
        (Relevant("order_detail", "20"),),
        "simple",
        "orders",
    ),
    Question(
        "spent-001",
        "How much has Ana Lima spent in total?",
        "$30.00",
        (Relevant("customer_profile", "2"),),
        "complex",
        "aggregates",
    ),
    Question(
        "edge-001",
        "What did Zebulon Quackenbush return?",
        "Cannot find that information in the provided data",
        (),
        "simple",
        "edge",
    ),
]


def _embed_everything(conn: psycopg.Connection[Any]) -> None:
    embedder = default_embedder()
    types = [r[0] for r in conn.execute("select distinct doc_type from pgrag.chunks")]
    for t in types:
        embed_type(conn, embedder, t)
    forget_vocabulary()


def _load(conn: psycopg.Connection[Any], comparisons: bool = False) -> None:
    load_tiny_shop(conn)
    if comparisons:
        declare_sample_documents(conn, recent_orders=2, comparisons=True)
        for t in ("table_row", "join_row"):
            conn.execute("select pgrag.refresh(%s)", (t,))
    _embed_everything(conn)


@pytest.fixture(scope="module")
def shop_url(pg_server: Any, template_db: str) -> Iterator[str]:
    """The tiny shop with its comparison types, every chunk embedded: loaded once, committed."""
    name = create_database(pg_server, template=template_db)
    url = pg_server.url_for(name)
    with psycopg.connect(url, autocommit=True) as c:
        _load(c, comparisons=True)
    yield url
    drop_database(pg_server, name)


@pytest.fixture
def shop(shop_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the tiny shop in a transaction that is always rolled back."""
    with psycopg.connect(shop_url) as c:
        register_vector(c)
        with c.transaction(force_rollback=True):
            yield c


def _hit(doc_type: str, key: str, metadata: dict[str, Any]) -> SearchHit:
    return SearchHit(
        1, doc_type, key, "", metadata, 1.0, None, None, None, None, None, None, None
    )  # fmt: skip


def test_the_credit_rule() -> None:
    hits = [
        _hit("table_row", "item:100", {"table": "order_items", "order_id": 10}),
        _hit("join_row", "101", {"order_id": 10, "customer_id": 1}),
        _hit("table_row", "product:1", {"table": "products", "product_id": 1}),
        _hit("order_detail", "11", {"order_id": 11, "customer_id": 1}),
    ]
    belongs = [belongs_to(h, SHOP_ENTITIES) for h in hits]
    assert belongs[1] == ["join_row:101", "order_detail:10", "customer_profile:1"]
    relevant = {"order_detail:10", "customer_profile:1"}
    # the item row takes the order; the second row of the same order gives its customer;
    # the product row and the unrelated order stay non-relevant at their ranks
    assert credit(belongs, relevant) == [
        "order_detail:10",
        "customer_profile:1",
        "table_row:product:1",
        "order_detail:11",
    ]
    again = [belongs[0], belongs[0]]
    assert credit(again, {"order_detail:10"}) == ["order_detail:10", "table_row:item:100"]


def test_hybrid_run_is_scored_by_the_metrics_module(shop: psycopg.Connection[Any]) -> None:
    r = run_eval(shop, QUESTIONS, "hybrid", k=5, embedder=default_embedder())
    assert r.report.skipped == ("edge-001",)
    assert r.report.mean.count == 3
    again = evaluate(qrels(QUESTIONS), r.run, 5, labels=labels(QUESTIONS))
    assert again == r.report
    by_id = {q.id: q for q in r.questions}
    assert by_id["returns-001"].ranking[0] in {"customer_profile:1", "order_detail:10"}
    assert {"name": "John Smith"} in (by_id["returns-001"].filter or {}).get("$or", [])
    assert r.report.mean.hit_rate == 1.0
    assert set(r.report.by_complexity) == {"simple", "complex"}
    assert r.latency_ms.p50 > 0 and r.latency_ms.p95 >= r.latency_ms.p50
    assert r.faithfulness.answers == 4 and r.faithfulness.mean == 1.0
    assert not r.faithfulness.used_llm and r.faithfulness.judged == 0
    assert r.embedding_model == default_embedder().name
    assert r.chunks == 7  # profiles and orders: the parse's types, not the comparison rows


def test_comparison_strategies_are_credited_through_their_keys(
    shop: psycopg.Connection[Any],
) -> None:
    r = run_eval(shop, QUESTIONS, "join_row", k=5, embedder=default_embedder())
    status = next(q for q in r.questions if q.id == "status-001")
    assert all(h.startswith("join_row:") for h in status.hits)
    assert "order_detail:20" in status.ranking  # join row 200 belongs to order 20
    assert r.chunks == 5
    t = run_eval(shop, QUESTIONS, "table_row", k=5, embedder=default_embedder())
    assert t.chunks == 15 and t.report.mean.count == 3


def test_unknown_strategy_and_missing_types_are_clear_errors(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(ConfigError, match="unknown strategy 'nope': use one of hybrid, vector"):
        run_eval(conn, QUESTIONS, "nope")
    load_tiny_shop(conn)
    with pytest.raises(ConfigError, match="table_row, which has no chunks.*--comparisons"):
        run_eval(conn, QUESTIONS, "table_row")


def test_store_run_writes_one_row_with_everything(shop: psycopg.Connection[Any]) -> None:
    r = run_eval(shop, QUESTIONS, "customer_profile", k=3, question_set="tiny")
    run_id = store_run(shop, r)
    row = shop.execute(
        "select question_set, question_set_sha256, strategy, k, questions, embedding_model, "
        "pgrag_version, metrics, by_label, per_query, faithfulness, latency_ms "
        "from pgrag.eval_runs where id = %s",
        (run_id,),
    ).fetchone()
    assert row is not None
    sset, sha, strategy, k, n, model, version, metrics, by_label, per_query, faith, lat = row
    assert (sset, strategy, k, n) == ("tiny", "customer_profile", 3, 4)
    assert re.fullmatch(r"[0-9a-f]{64}", sha) and model == default_embedder().name and version
    assert metrics["count"] == 3 and metrics["skipped"] == ["edge-001"]
    assert metrics["recall"] == pytest.approx(r.report.mean.recall, abs=1e-6)
    assert set(by_label) == {"complexity", "category"}
    assert by_label["category"]["returns"]["count"] == 1
    assert [q["id"] for q in per_query] == [q.id for q in QUESTIONS]
    assert per_query[3]["scores"] is None and per_query[0]["category"] == "returns"
    assert set(lat) == {"p50", "p95", "mean", "max"}
    assert faith["answers"] == 4 and "mean" in faith
    listed = list_runs(shop, strategy="customer_profile")
    assert listed[0].id == run_id and listed[0].metrics["count"] == 3


def test_llm_answers_are_judged(shop: psycopg.Connection[Any]) -> None:
    verdict = {
        "contradicts_context": False,
        "uses_outside_info": False,
        "fully_supported": True,
        "score": 1,
        "reason": "ok",
    }

    def reply(body: dict[str, Any]) -> Reply:
        if body["messages"][0]["content"] == JUDGE_PROMPT:
            return Reply(json.dumps(verdict))
        return Reply("John Smith returned a Wireless Mouse in 1999 [chunk 1].")

    with ChatServer(reply) as server:
        llm = LLMConfig(model="fake-model", base_url=server.url, api_key="k")
        r = run_eval(shop, QUESTIONS[:2], "hybrid", k=5, llm=llm, embedder=default_embedder())
    assert r.faithfulness.used_llm and r.faithfulness.judged == 2
    assert r.faithfulness.judge_mean == 1.0 and r.faithfulness.judge_fully_supported == 1.0
    assert all("1999" in q.unsupported for q in r.questions)  # the offline check disagrees
    assert r.questions[0].verdict is not None and r.questions[0].verdict.model == "fake-model"


def test_strategy_bench_on_the_tiny_shop(db_url: str) -> None:
    lines: list[str] = []
    bench = run_strategy_bench(
        db_url,
        customers=3,
        limit_per_template=1,
        embedder=default_embedder(),
        say=lines.append,
        load=lambda c: load_tiny_shop(c),
    )
    assert [r.strategy for r in bench.rows] == [
        "table_row",
        "join_row",
        "customer_profile",
        "parent_child",
        "hybrid",
    ]
    chunks = {r.strategy: r.chunks for r in bench.rows}
    assert chunks == {
        "table_row": 15,
        "join_row": 5,
        "customer_profile": 3,
        "parent_child": 7,
        "hybrid": 7,
    }
    assert all(c.embedded == c.chunks for c in bench.index)
    assert bench.scored > 0 and all(r.index_s is not None for r in bench.rows)
    md = markdown(bench)
    assert "| strategy | chunks |" in md and "| hybrid | 7 |" in md
    assert "Recall@5 by category" in md and "A perfect ranking would score P@5" in md
    assert bench.ceiling is not None and bench.ceiling.mean.hit_rate == 1.0
    data = bench.to_json()
    assert data["strategies"][4]["at10"]["strategy"] == "hybrid"
    json.dumps(data, default=str)


# ---- the CLI ----


def test_cli_eval_prints_writes_json_and_stores(shop_url: str, tmp_path: Path) -> None:
    qfile = tmp_path / "tiny.jsonl"
    write_jsonl(qfile, QUESTIONS)
    out = tmp_path / "out.json"
    env = {"PGRAG_DATABASE_URL": shop_url}
    r = run_pgrag(
        "eval", str(qfile), "--k", "5", "--output", str(out), "--store", "--no-progress", env=env
    )
    assert r.returncode == 0, r.stderr
    assert "strategy hybrid, k = 5, parsed filters: 4 questions, 3 scored, 1 skipped" in r.stdout
    assert "faithfulness (extractive answers, offline check): 1.000" in r.stdout
    assert "stored as pgrag.eval_runs id" in r.stdout
    data = json.loads(out.read_text())
    assert data["question_set"] == "tiny" and data["k"] == 5 and data["eval_run_id"] >= 1
    assert data["metrics"]["count"] == 3 and len(data["per_query"]) == 4
    assert set(data["by_label"]) == {"complexity", "category"}
    runs = run_pgrag("eval-runs", env=env)
    assert runs.returncode == 0 and " tiny " in runs.stdout and "hybrid" in runs.stdout
    text = run_pgrag("eval", str(qfile), "--strategy", "text", "--json", env=env)
    assert text.returncode == 0, text.stderr
    assert json.loads(text.stdout)["strategy"] == "text"


def test_cli_eval_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "q1", "question": "x"}\n', encoding="utf-8")
    r = run_pgrag("eval", str(bad))
    assert r.returncode == 2
    assert r.stderr.startswith("pgrag: error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "bad.jsonl line 1: field 'expected_answer' is missing" in r.stderr
    r = run_pgrag("eval", str(bad), "--strategy", "nope")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "pgrag: error: unknown strategy 'nope': use one of hybrid, vector, text, "
        "customer_profile, parent_child, table_row, join_row (docs/evaluation.md)"
    )
    r = run_pgrag("eval", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and "cannot read questions file" in r.stderr
    r = run_pgrag("bench", "strategies", "--strategy", "nope")
    assert r.returncode == 2 and "unknown strategy 'nope'" in r.stderr
