"""Evaluation: retrieval metrics (``metrics``) and labelled question sets (``questions``)."""

from pgrag.lab.eval.metrics import (
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
from pgrag.lab.eval.questions import (
    Question,
    Relevant,
    generate_shop_questions,
    generate_type_questions,
    labels,
    qrels,
    read_jsonl,
    write_jsonl,
)

__all__ = [
    "Question",
    "Relevant",
    "generate_shop_questions",
    "generate_type_questions",
    "labels",
    "qrels",
    "read_jsonl",
    "write_jsonl",
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
