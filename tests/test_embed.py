"""Embedders: the offline model, its ONNX build, an OpenAI-compatible server; the query cache."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest

from pgrag.embed import DEFAULT_MODEL, QueryCache, RetryPolicy, embed_with_retry, get_embedder
from pgrag.embed.base import EmbedError
from pgrag.embed.onnx import OnnxEmbedder
from pgrag.embed.openai import OpenAIEmbedder
from pgrag.embed.sentence_transformers import SentenceTransformerEmbedder, bundled_model_dir
from pgrag.errors import ConfigError, EmbeddingFailed

from .embed_server import FakeEmbeddings, Recording, default_embedder, fake_vector, texts

FAST = RetryPolicy(attempts=4, base_s=0.01, max_s=0.05)
SAMPLE = [
    *texts(20),
    "",
    "Café ünïcödé 日本語 — naïve résumé",
    "word " * 600,  # far past 256 word pieces: truncated the same way by both builds
]


@pytest.fixture
def fake() -> Iterator[FakeEmbeddings]:
    server = FakeEmbeddings()
    yield server
    server.close()


def test_default_is_the_bundled_minilm_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGRAG_EMBEDDER", raising=False)
    e = get_embedder(None)
    assert isinstance(e, SentenceTransformerEmbedder)
    assert (e.name, e.dimension) == (DEFAULT_MODEL, 384)
    assert get_embedder("all-MiniLM-L6-v2").name == DEFAULT_MODEL
    # the bundled folder given as a path is the same model
    assert get_embedder(f"sentence-transformers:{bundled_model_dir()}").name == DEFAULT_MODEL


def test_default_vectors_are_the_models_own() -> None:
    from sentence_transformers import SentenceTransformer

    e = default_embedder()
    ours = e.embed(SAMPLE)
    raw = SentenceTransformer(str(bundled_model_dir()), device="cpu", local_files_only=True)
    theirs = raw.encode(SAMPLE, normalize_embeddings=True, convert_to_numpy=True)
    assert ours.dtype == np.float32 and ours.shape == (len(SAMPLE), 384)
    assert np.allclose(ours, theirs, atol=1e-5)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_onnx_build_is_interchangeable_with_pytorch() -> None:
    onnx = get_embedder("onnx")
    assert isinstance(onnx, OnnxEmbedder)
    assert (onnx.name, onnx.dimension) == (DEFAULT_MODEL, 384)
    a = default_embedder().embed(SAMPLE)
    b = onnx.embed(SAMPLE)
    cos = (a * b).sum(axis=1)
    assert b.dtype == np.float32
    assert cos.mean() >= 0.999, cos
    assert cos.min() >= 0.995, cos  # int8 weights; the empty text is the worst case
    # order is kept although texts are sorted by length inside
    assert np.allclose(onnx.embed(SAMPLE[::-1])[::-1], b, atol=1e-5)


def test_spec_errors_say_what_to_write(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "OPENAI_API_KEY",
        "PGRAG_OPENAI_API_KEY",
        "PGRAG_OPENAI_BASE_URL",
        "OPENAI_BASE_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="unknown embedder 'bogus': use one of"):
        get_embedder("bogus")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        get_embedder("openai:text-embedding-3-small")
    with pytest.raises(ConfigError, match="names no model"):
        get_embedder("openai:")
    with pytest.raises(ConfigError, match="does not exist"):
        get_embedder("sentence-transformers:/nowhere/model")
    monkeypatch.setenv("PGRAG_EMBEDDER", "onnx")
    assert isinstance(get_embedder(None), OnnxEmbedder)
    monkeypatch.setenv("PGRAG_OPENAI_DIMENSIONS", "many")
    monkeypatch.setenv("PGRAG_OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="PGRAG_OPENAI_DIMENSIONS='many'"):
        get_embedder("openai:x")


def _openai(fake: FakeEmbeddings, **kw: Any) -> OpenAIEmbedder:
    return OpenAIEmbedder("fake-embed", base_url=fake.base_url, dimensions=fake.dim, **kw)


def test_openai_batches_and_keeps_order(fake: FakeEmbeddings) -> None:
    e = _openai(fake, batch_size=4)
    assert (e.name, e.dimension) == ("openai:fake-embed", 384)
    batch = list(texts(10))
    out = e.embed(batch)
    assert [len(r["input"]) for r in fake.requests] == [4, 4, 2]
    assert fake.requests[0]["encoding_format"] == "float"
    assert fake.requests[0]["dimensions"] == 384
    assert np.allclose(out, np.stack([fake_vector(t, 384) for t in batch]), atol=1e-6)


def test_openai_retries_rate_limits_and_server_errors(fake: FakeEmbeddings) -> None:
    fake.script = deque([(429, {"Retry-After": "0"}), (500, {}), (503, {})])
    out = embed_with_retry(_openai(fake), ["a", "b"], FAST)
    assert len(fake.requests) == 4
    assert np.allclose(out[1], fake_vector("b", 384), atol=1e-6)


def test_openai_gives_up_after_the_retries(fake: FakeEmbeddings) -> None:
    fake.always = 500
    with pytest.raises(EmbedError, match=r"answered 500.*gave up after 4 attempts") as err:
        embed_with_retry(_openai(fake), ["a"], FAST)
    assert err.value.transient and isinstance(err.value, EmbeddingFailed)
    assert len(fake.requests) == 4


def test_openai_bad_answers_are_not_retried(fake: FakeEmbeddings) -> None:
    fake.dim_override = 12
    with pytest.raises(EmbedError, match="12-dimensional vectors, expected 384") as err:
        embed_with_retry(_openai(fake), ["a"], FAST)
    assert not err.value.transient and len(fake.requests) == 1
    fake.dim_override = None
    fake.poison = "POISON"
    with pytest.raises(EmbedError, match="answered 400 .*input rejected") as err:
        embed_with_retry(_openai(fake), ["POISON"], FAST)
    assert not err.value.transient


def test_openai_unreachable_is_transient() -> None:
    e = OpenAIEmbedder("x", base_url="http://127.0.0.1:9/v1", dimensions=3, timeout_s=2)
    with pytest.raises(EmbedError, match="cannot reach") as err:
        embed_with_retry(e, ["a"], RetryPolicy(attempts=2, base_s=0.01))
    assert err.value.transient


def test_openai_asks_the_dimension_once(fake: FakeEmbeddings) -> None:
    e = OpenAIEmbedder("fake-embed", base_url=fake.base_url)  # no dimensions: probed
    assert e.dimension == 384 and e.dimension == 384
    assert len(fake.requests) == 1 and "dimensions" not in fake.requests[0]


def test_query_cache_memory_then_database_then_ttl(conn: psycopg.Connection[Any]) -> None:
    model = Recording(default_embedder())
    cache = QueryCache(model)
    first = cache.embed(conn, "Which  customers returned garden hoses?")
    assert (first.source, first.cache_hit) == ("model", False)
    expected = default_embedder().embed(["Which customers returned garden hoses?"])[0]
    assert np.allclose(first.vector, expected, atol=1e-5)
    again = cache.embed(conn, "  Which customers returned garden hoses? ")
    assert (again.source, again.cache_hit) == ("memory", True)
    # another process: an empty LRU, the same table
    other = QueryCache(model).embed(conn, "Which customers returned garden hoses?")
    assert other.source == "database"
    assert np.allclose(other.vector, first.vector, atol=1e-6)
    assert model.calls == 1
    # older than the server's TTL (pgrag.settings.query_cache_ttl, a week by default)
    conn.execute("update pgrag.query_cache set created_at = now() - interval '8 days'")
    stale = QueryCache(model).embed(conn, "Which customers returned garden hoses?")
    assert stale.source == "model" and model.calls == 2
    row = conn.execute("select count(*) from pgrag.query_cache").fetchone()
    assert row == (1,)


def test_query_cache_is_per_model(conn: psycopg.Connection[Any], fake: FakeEmbeddings) -> None:
    a = QueryCache(default_embedder()).embed(conn, "same question")
    b = QueryCache(_openai(fake)).embed(conn, "same question")
    assert a.source == b.source == "model"
    assert not np.allclose(a.vector, b.vector)
