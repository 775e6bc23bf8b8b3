"""Embedders (sentence-transformers, ONNX Runtime, OpenAI-compatible) and the caches."""

from pgrag.embed.base import (
    DEFAULT_DIMENSION,
    DEFAULT_MODEL,
    Embedder,
    EmbedError,
    RetryPolicy,
    Vectors,
    embed_with_retry,
)
from pgrag.embed.cache import QueryCache, QueryVector, content_hash, normalize_query
from pgrag.embed.registry import get_embedder

__all__ = [
    "DEFAULT_DIMENSION",
    "DEFAULT_MODEL",
    "EmbedError",
    "Embedder",
    "QueryCache",
    "QueryVector",
    "RetryPolicy",
    "Vectors",
    "content_hash",
    "embed_with_retry",
    "get_embedder",
    "normalize_query",
]
