"""Dedup, then rerank retrieved hits with a local cross-encoder (or pass them through).

Dedup keeps the first of: hits with the same (doc_type, source_key), hits with the same text
(whitespace and case aside), and near-duplicates, whose word 3-shingles (word sets for texts
under three words) have a Jaccard similarity of at least 0.92.

Rerank scores (question, text) pairs with a sentence-transformers ``CrossEncoder`` loaded from
a local folder (the ``model_path`` argument or ``PGRAG_RERANK_MODEL``; never a hub name), keeps
the hits scoring at least ``threshold`` and returns the best ``top_n`` (default 3). With no model
configured the hits keep their retrieval order, and the result says so.

Both work on any hit with ``id``, ``source_key``, ``doc_type``, ``text`` and ``score``
(``HitLike``), such as ``Hit``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pgrag import config
from pgrag.errors import ConfigError, MissingDependency

ENV_RERANK_MODEL = "PGRAG_RERANK_MODEL"
ENV_RERANK_THRESHOLD = "PGRAG_RERANK_THRESHOLD"
DEFAULT_TOP_N = 3
DEFAULT_JACCARD = 0.92
SHINGLE_WORDS = 3

_WORD_RE = re.compile(r"\w+")


class HitLike(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def source_key(self) -> str: ...
    @property
    def doc_type(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def score(self) -> float: ...


H = TypeVar("H", bound=HitLike)


@dataclass(frozen=True)
class Hit:
    id: int
    source_key: str
    doc_type: str
    text: str
    score: float


@dataclass(frozen=True)
class Dropped:
    """A hit dedup removed, the hit it duplicates, and why."""

    id: int
    duplicate_of: int
    reason: str  # "same source", "identical text" or "near-duplicate (jaccard 0.95)"


@dataclass(frozen=True)
class Deduped(Generic[H]):
    hits: tuple[H, ...]
    dropped: tuple[Dropped, ...]


@dataclass(frozen=True)
class Ranked(Generic[H]):
    hit: H
    rerank_score: float | None  # None when no reranker ran


@dataclass(frozen=True)
class RerankResult(Generic[H]):
    hits: tuple[Ranked[H], ...]
    model: str | None  # the model folder, or None for pass-through
    note: str
    dropped: tuple[Dropped, ...] = ()


# ---- dedup ----


def words(text: str) -> list[str]:
    return _WORD_RE.findall(text.casefold())


def shingles(text: str, size: int = SHINGLE_WORDS) -> frozenset[tuple[str, ...]]:
    """Word ``size``-shingles of ``text``; its word set (1-tuples) when it is shorter."""
    ws = words(text)
    if len(ws) < size:
        return frozenset((w,) for w in ws)
    return frozenset(tuple(ws[i : i + size]) for i in range(len(ws) - size + 1))


def jaccard(a: frozenset[Any], b: frozenset[Any]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def dedup(hits: Sequence[H], *, threshold: float = DEFAULT_JACCARD) -> Deduped[H]:
    """The hits without duplicates, in their order (the first of a group is kept)."""
    kept: list[H] = []
    kept_shingles: list[frozenset[tuple[str, ...]]] = []
    sources: dict[tuple[str, str], int] = {}
    texts: dict[str, int] = {}
    dropped: list[Dropped] = []
    for hit in hits:
        source = (hit.doc_type, hit.source_key)
        if source in sources:
            dropped.append(Dropped(hit.id, sources[source], "same source"))
            continue
        normalized = " ".join(hit.text.casefold().split())
        if normalized in texts:
            dropped.append(Dropped(hit.id, texts[normalized], "identical text"))
            continue
        mine = shingles(hit.text)
        near = next(
            (
                (other, similarity)
                for other, theirs in zip(kept, kept_shingles, strict=True)
                if (similarity := jaccard(mine, theirs)) >= threshold
            ),
            None,
        )
        if near is not None:
            reason = "near-duplicate (jaccard " + format(near[1], ".2f") + ")"
            dropped.append(Dropped(hit.id, near[0].id, reason))
            continue
        kept.append(hit)
        kept_shingles.append(mine)
        sources[source] = hit.id
        texts[normalized] = hit.id
    return Deduped(tuple(kept), tuple(dropped))


# ---- rerank ----


class Reranker:
    """A cross-encoder from a local folder, or a pass-through when none is configured.

    ``model_path``: a folder holding a CrossEncoder (config.json, weights, tokenizer);
    None reads ``PGRAG_RERANK_MODEL`` (unset or empty: pass-through). The model loads on first
    use. ``threshold`` (or ``PGRAG_RERANK_THRESHOLD``) drops hits scoring below it.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        threshold: float | None = None,
        top_n: int = DEFAULT_TOP_N,
        device: str = "cpu",
        batch_size: int = 32,
        use_env: bool = True,
    ) -> None:
        if top_n < 1:
            raise ConfigError("rerank top_n is " + str(top_n) + ": use 1 or more")
        raw = model_path if model_path is not None else _env(ENV_RERANK_MODEL, use_env)
        self.model_path = _check_model_path(raw) if raw else None
        self.threshold = threshold if threshold is not None else _env_threshold(use_env)
        self.top_n = top_n
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def configured(self) -> bool:
        return self.model_path is not None

    def rerank(self, query: str, hits: Sequence[H], *, deduplicate: bool = True) -> RerankResult[H]:
        """Dedup (by default), score and keep the best ``top_n`` hits at or above threshold."""
        deduped = dedup(hits) if deduplicate else Deduped(tuple(hits), ())
        candidates = deduped.hits
        if self.model_path is None:
            return RerankResult(
                tuple(Ranked(h, None) for h in candidates[: self.top_n]),
                None,
                "no reranker configured (set " + ENV_RERANK_MODEL + " to a local CrossEncoder "
                "folder to enable one): kept the retrieval order",
                deduped.dropped,
            )
        scores = self.scores(query, [h.text for h in candidates])
        # Best first; a stable sort keeps the retrieval order among equal scores.
        order = sorted(range(len(candidates)), key=lambda i: scores[i], reverse=True)
        ranked = [Ranked(candidates[i], scores[i]) for i in order]
        kept = [
            r
            for r in ranked
            if self.threshold is None
            or (r.rerank_score is not None and r.rerank_score >= self.threshold)
        ]
        note = "reranked " + str(len(candidates)) + " hits with " + str(self.model_path)
        if self.threshold is not None:
            note += "; " + str(len(ranked) - len(kept)) + " below threshold " + str(self.threshold)
        return RerankResult(tuple(kept[: self.top_n]), str(self.model_path), note, deduped.dropped)

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        """The cross-encoder's score of (query, text) for each text (needs a model)."""
        if not texts:
            return []
        model = self._load()
        raw = model.predict(
            [(query, t) for t in texts],
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
        if getattr(raw, "ndim", 1) == 2:
            if raw.shape[1] != 1:
                raise ConfigError(
                    "rerank model "
                    + str(self.model_path)
                    + " has "
                    + str(raw.shape[1])
                    + " outputs: use a cross-encoder with one relevance score (num_labels=1)"
                )
            raw = raw[:, 0]
        return [float(x) for x in raw]

    def _load(self) -> Any:
        with self._lock:
            if self._model is not None:
                return self._model
            try:
                st = importlib.import_module("sentence_transformers")
            except ImportError as exc:
                raise MissingDependency(
                    "reranking needs sentence-transformers: pip install 'pgrag-relational[st]'"
                    ", or unset " + ENV_RERANK_MODEL
                ) from exc
            try:
                self._model = st.CrossEncoder(
                    str(self.model_path), device=self.device, local_files_only=True
                )
            except Exception as exc:  # torch/transformers raise many kinds
                reason = (
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                )
                raise ConfigError(
                    "cannot load the rerank model from "
                    + str(self.model_path)
                    + " ("
                    + reason
                    + "): point "
                    + ENV_RERANK_MODEL
                    + " at a sentence-transformers CrossEncoder "
                    "folder"
                ) from exc
            return self._model


def _env(name: str, use_env: bool) -> str | None:
    return config.env(name) if use_env else None


def _env_threshold(use_env: bool) -> float | None:
    raw = _env(ENV_RERANK_THRESHOLD, use_env)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(
            ENV_RERANK_THRESHOLD + "=" + repr(raw) + " is not a number: set it to e.g. 0.5"
        ) from None


def _check_model_path(raw: str | os.PathLike[str]) -> Path:
    path = Path(raw).expanduser()
    if not path.exists():
        raise ConfigError(
            "rerank model folder "
            + str(path)
            + " does not exist: set "
            + ENV_RERANK_MODEL
            + " (or model_path) to a local CrossEncoder folder, or unset it to skip reranking"
        )
    if not (path / "config.json").is_file():
        raise ConfigError(
            "rerank model folder " + str(path) + " has no config.json: save a CrossEncoder there "
            "with model.save_pretrained(...) or point " + ENV_RERANK_MODEL + " at one"
        )
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if (
        isinstance(architectures, list)
        and architectures
        and not any(str(a).endswith("ForSequenceClassification") for a in architectures)
    ):
        raise ConfigError(
            "rerank model folder " + str(path) + " holds a " + str(architectures[0]) + ", not a "
            "cross-encoder (a *ForSequenceClassification model): point "
            + ENV_RERANK_MODEL
            + " at a CrossEncoder folder, not an embedding model"
        )
    return path.absolute()
