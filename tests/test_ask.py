"""The ask pipeline on the tiny shop with the real default model: parse → embed → search (+
stats) → dedup → rerank → answer, extractive and through a local chat endpoint."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgrag.answer import LLMConfig
from pgrag.ask import ask, forget_catalog
from pgrag.embed.base import Embedder

from .chat_server import ChatServer, Reply
from .embed_server import default_embedder
from .shop_fixture import load_tiny_shop


@pytest.fixture
def shop(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    embedder: Embedder = default_embedder()
    load_tiny_shop(conn)
    rows = conn.execute("select id, text from pgrag.chunks order by id").fetchall()
    vecs = embedder.embed([r[1] for r in rows])
    conn.execute("update pgrag.settings set embedding_model = %s", (embedder.name,))
    for (cid, _), v in zip(rows, vecs, strict=True):
        conn.execute(
            "update pgrag.chunks set embedding = %s::real[]::vector, embedding_model = %s "
            "where id = %s",
            (v.tolist(), embedder.name, cid),
        )
    forget_catalog()
    return conn


def test_a_name_becomes_a_customer_filter_and_the_answer_cites_returns(
    shop: psycopg.Connection[Any],
) -> None:
    r = ask(
        shop, "What products did John Smith return?", embedder=default_embedder(), use_env_llm=False
    )
    assert r.filter.get("customer_id") == 1 and "John Smith is customer 1" in r.notes
    assert r.hits and all(h.metadata.get("customer_id") == 1 for h in r.hits)
    assert "Wireless Mouse" in r.answer.text and not r.answer.used_llm
    assert set(r.answer.cited_ids) <= {h.id for h in r.hits}
    assert set(r.timings) == {
        "parse_ms",
        "embed_ms",
        "search_ms",
        "rerank_ms",
        "generate_ms",
        "total_ms",
    }
    assert r.cache_hit is False
    again = ask(
        shop, "What products did John Smith return?", embedder=default_embedder(), use_env_llm=False
    )
    assert again.cache_hit is True


def test_questions_asking_for_numbers_get_exact_stats(shop: psycopg.Connection[Any]) -> None:
    r = ask(
        shop,
        "What's the total revenue and average order value for VIP customers?",
        embedder=default_embedder(),
        use_env_llm=False,
    )
    assert r.parsed.needs_stats and r.stats
    vip = next(iter(r.stats.values()))
    assert vip["revenue"] == 240.0 and vip["average_order_value"] == 80.0
    assert "240" in r.answer.text


def test_undelivered_orders_of_a_customer_in_a_month(shop: psycopg.Connection[Any]) -> None:
    r = ask(
        shop,
        "Which products did customer 1 buy in January 2024 that haven't been delivered yet?",
        embedder=default_embedder(),
        use_env_llm=False,
    )
    assert [h.source_key for h in r.retrieved] == ["11"]  # shipped on 2024-01-20
    assert r.scan == "exact"


def test_answer_through_a_chat_endpoint(shop: psycopg.Connection[Any]) -> None:
    with ChatServer([Reply("He returned a Wireless Mouse [chunk 1].")]) as server:
        llm = LLMConfig(model="fake-model", base_url=server.url, api_key="k")
        r = ask(shop, "What products did John Smith return?", embedder=default_embedder(), llm=llm)
        prompt = server.requests[0]["body"]["messages"][1]["content"]
    assert r.answer.used_llm and r.answer.model == "fake-model"
    assert "Wireless Mouse" in prompt and "<<<DATA" in prompt
    assert r.timings["generate_ms"] > 0
