"""Evaluation: retrieval metrics (``metrics``) and labelled question sets (``questions``)."""

from pgrag.eval.metrics import (
    Means,
    QueryScores,
    Report,
    evaluate,
    f1_at_k,
    hit_rate_at_k,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
    reciprocal_rank,
)

__all__ = [
    "Means",
    "QueryScores",
    "Report",
    "evaluate",
    "f1_at_k",
    "hit_rate_at_k",
    "ndcg_at_k",
    "precision_at_k",
    "recall_at_k",
    "reciprocal_rank",
]
