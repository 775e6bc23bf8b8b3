"""Retrieval metrics at a cutoff k: pure functions, no I/O.

Inputs
------
- Relevance judgments (*qrels*): ``{query_id: {doc_id: grade}}``. A document is relevant when
  its grade is >= 1 (trec_eval's default ``rel_level``); grades <= 0 and unjudged documents are
  not relevant and have gain 0.
- A ranking for one query: either a ranked sequence of doc ids (best first) or a mapping
  ``{doc_id: score}``. Scores are ranked as trec_eval ranks them: score descending, ties broken
  by doc id *descending* (so ``{"a": 1.0, "b": 1.0}`` ranks ``b`` first). A doc id that occurs
  twice in a sequence counts once, at its first rank.
- A run: ``{query_id: ranking}``.

Definitions for one query, with ``top`` = the first k ranked docs and ``R`` = the relevant docs
(k must be >= 1):

- ``hit_rate@k`` = 1 if ``|R ∩ top| > 0`` else 0 (ir-measures ``Success@k``).
- ``recall@k`` = ``|R ∩ top| / |R|``; 0 when ``R`` is empty (ir-measures ``R@k``).
- ``precision@k`` = ``|R ∩ top| / k``; the denominator is k even when fewer than k docs were
  retrieved (trec_eval ``P_k``).
- ``f1@k`` = ``2 P R / (P + R)``; 0 when both are 0.
- ``reciprocal_rank(k)`` = ``1 / rank`` of the first relevant doc within the top k, else 0
  (ir-measures ``RR@k``; with ``k=None`` over the whole ranking, ``RR``). ``MRR`` is its mean.
- ``ndcg@k`` = ``DCG@k / IDCG@k`` with ``DCG@k = Σ_{i=1..k} gain(grade_i) / log2(i + 1)`` and
  IDCG@k the DCG of the ideal ranking: all judged docs sorted by grade, descending, cut at k.
  Linear gain ``gain(g) = g`` is trec_eval's ``ndcg_cut`` and BEIR's; exponential gain
  ``gain(g) = 2**g - 1`` (Burges et al.) is an option. IDCG 0 (no relevant doc) gives 0.

Averaging (``evaluate``)
------------------------
- Queries in the qrels but absent from the run count as an empty ranking (all metrics 0), like
  ``trec_eval -c`` and ir-measures.
- Queries in the run but absent from the qrels are ignored, as trec_eval ignores them.
- Queries with no relevant document (e.g. "a customer that does not exist": the right answer is
  to find nothing) are **skipped**: they get no per-query scores, do not enter any mean, and are
  listed in ``Report.skipped``. Retrieval metrics are undefined for them; judge them on the
  answer instead. (trec_eval and ir-measures would score them 0 and average the zeros in; the
  per-query functions here return 0 for them too, so only the averaging differs.)
- Means are arithmetic means over the scored queries; breakdowns average the same per-query
  values over the queries that carry each label value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from pgrag.errors import ConfigError

Ranking: TypeAlias = Sequence[str] | Mapping[str, float]
Qrels: TypeAlias = Mapping[str, Mapping[str, int]]
Run: TypeAlias = Mapping[str, Ranking]
Gain: TypeAlias = Literal["linear", "exponential"]

METRICS: tuple[str, ...] = ("hit_rate", "recall", "precision", "f1", "mrr", "ndcg")


def ranked(ranking: Ranking) -> list[str]:
    """The doc ids best first: scores by trec_eval's order, duplicates dropped (first kept)."""
    if isinstance(ranking, Mapping):
        # score descending, then doc id descending (trec_eval and pytrec_eval)
        return sorted(ranking, key=lambda d: (ranking[d], d), reverse=True)
    if isinstance(ranking, str):
        raise ConfigError(
            "a ranking is a sequence of doc ids or a {doc_id: score} mapping, not one string: "
            "wrap it in a list"
        )
    seen: set[str] = set()
    out: list[str] = []
    for doc in ranking:
        if doc not in seen:
            seen.add(doc)
            out.append(doc)
    return out


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"cutoff k must be an integer >= 1, got {k!r}: pass e.g. k=10")


def _relevant(judged: Mapping[str, int]) -> set[str]:
    return {doc for doc, grade in judged.items() if grade >= 1}


def _hits(ranking: Ranking, judged: Mapping[str, int], k: int) -> int:
    _check_k(k)
    rel = _relevant(judged)
    return sum(1 for doc in ranked(ranking)[:k] if doc in rel)


def hit_rate_at_k(ranking: Ranking, judged: Mapping[str, int], k: int) -> float:
    """1.0 if any relevant doc is in the top k, else 0.0 (ir-measures ``Success@k``)."""
    return 1.0 if _hits(ranking, judged, k) > 0 else 0.0


def recall_at_k(ranking: Ranking, judged: Mapping[str, int], k: int) -> float:
    """``|relevant ∩ top k| / |relevant|``; 0.0 when nothing is relevant (ir-measures ``R@k``)."""
    hits = _hits(ranking, judged, k)
    n_rel = len(_relevant(judged))
    return hits / n_rel if n_rel else 0.0


def precision_at_k(ranking: Ranking, judged: Mapping[str, int], k: int) -> float:
    """``|relevant ∩ top k| / k``, k even when fewer docs were retrieved (trec_eval ``P_k``)."""
    return _hits(ranking, judged, k) / k


def f1_at_k(ranking: Ranking, judged: Mapping[str, int], k: int) -> float:
    """Harmonic mean of precision@k and recall@k; 0.0 when both are 0."""
    p = precision_at_k(ranking, judged, k)
    r = recall_at_k(ranking, judged, k)
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def reciprocal_rank(ranking: Ranking, judged: Mapping[str, int], k: int | None = None) -> float:
    """``1 / rank`` of the first relevant doc in the top k (whole ranking if k is None), else 0."""
    if k is not None:
        _check_k(k)
    rel = _relevant(judged)
    docs = ranked(ranking)
    for i, doc in enumerate(docs if k is None else docs[:k], start=1):
        if doc in rel:
            return 1.0 / i
    return 0.0


def _gain(grade: int, gain: Gain) -> float:
    if grade <= 0:
        return 0.0
    if gain == "linear":
        return float(grade)
    if gain == "exponential":
        return float(2**grade - 1)
    raise ConfigError(f"unknown gain {gain!r}: use 'linear' (trec_eval, BEIR) or 'exponential'")


def dcg_at_k(grades: Sequence[int], k: int, gain: Gain = "linear") -> float:
    """``Σ_{i=1..k} gain(grades[i-1]) / log2(i + 1)`` for grades in rank order."""
    _check_k(k)
    return sum(_gain(g, gain) / math.log2(i + 1) for i, g in enumerate(grades[:k], start=1))


def ndcg_at_k(ranking: Ranking, judged: Mapping[str, int], k: int, gain: Gain = "linear") -> float:
    """``DCG@k / IDCG@k`` (see the module docstring); 0.0 when IDCG@k is 0."""
    _check_k(k)
    ideal = dcg_at_k(sorted(judged.values(), reverse=True), k, gain)
    if ideal == 0:
        return 0.0
    actual = dcg_at_k([judged.get(doc, 0) for doc in ranked(ranking)[:k]], k, gain)
    return actual / ideal


@dataclass(frozen=True)
class QueryScores:
    """All metrics of one query at the report's cutoff k."""

    query_id: str
    hit_rate: float
    recall: float
    precision: float
    f1: float
    mrr: float  # reciprocal rank within the top k
    ndcg: float
    relevant: int  # |relevant|
    retrieved: int  # distinct docs in the ranking (before the cutoff)


@dataclass(frozen=True)
class Means:
    """Metric means over ``count`` queries (all 0.0 when count is 0)."""

    count: int
    hit_rate: float
    recall: float
    precision: float
    f1: float
    mrr: float
    ndcg: float

    @classmethod
    def of(cls, scores: Sequence[QueryScores]) -> Means:
        n = len(scores)
        if n == 0:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        return cls(
            n,
            *(math.fsum(getattr(s, m) for s in scores) / n for m in METRICS),
        )


@dataclass(frozen=True)
class Report:
    """Per-query scores, their means, and means broken down by each label."""

    k: int
    gain: Gain
    per_query: tuple[QueryScores, ...]  # in qrels order, skipped queries left out
    mean: Means
    by_label: Mapping[str, Mapping[str, Means]]  # label name -> label value -> means
    skipped: tuple[str, ...]  # queries with no relevant doc

    @property
    def by_complexity(self) -> Mapping[str, Means]:
        return self.by_label.get("complexity", {})

    @property
    def by_category(self) -> Mapping[str, Means]:
        return self.by_label.get("category", {})


def score_query(
    query_id: str, ranking: Ranking, judged: Mapping[str, int], k: int, gain: Gain = "linear"
) -> QueryScores:
    """Every metric of one query at cutoff k."""
    _check_k(k)
    return QueryScores(
        query_id=query_id,
        hit_rate=hit_rate_at_k(ranking, judged, k),
        recall=recall_at_k(ranking, judged, k),
        precision=precision_at_k(ranking, judged, k),
        f1=f1_at_k(ranking, judged, k),
        mrr=reciprocal_rank(ranking, judged, k),
        ndcg=ndcg_at_k(ranking, judged, k, gain),
        relevant=len(_relevant(judged)),
        retrieved=len(ranked(ranking)),
    )


def evaluate(
    qrels: Qrels,
    run: Run,
    k: int,
    *,
    labels: Mapping[str, Mapping[str, str]] | None = None,
    gain: Gain = "linear",
) -> Report:
    """Score every judged query at cutoff k and average (rules in the module docstring).

    ``labels`` maps a query id to its labels, e.g. ``{"q1": {"complexity": "simple",
    "category": "returns"}}``; the report averages per label name and value. A query without
    a given label is left out of that label's breakdown.
    """
    _check_k(k)
    _gain(1, gain)  # reject an unknown gain before any work
    empty: list[str] = []
    scores: list[QueryScores] = []
    skipped: list[str] = []
    for qid, judged in qrels.items():
        if not _relevant(judged):
            skipped.append(qid)
            continue
        scores.append(score_query(qid, run.get(qid, empty), judged, k, gain))
    groups: dict[str, dict[str, list[QueryScores]]] = {}
    for s in scores:
        for name, value in (labels or {}).get(s.query_id, {}).items():
            groups.setdefault(name, {}).setdefault(value, []).append(s)
    by_label = {
        name: {value: Means.of(group) for value, group in sorted(values.items())}
        for name, values in sorted(groups.items())
    }
    return Report(
        k=k,
        gain=gain,
        per_query=tuple(scores),
        mean=Means.of(scores),
        by_label=by_label,
        skipped=tuple(skipped),
    )
