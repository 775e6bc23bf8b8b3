"""The Embedder protocol, its failures and retries, and ``get_embedder(spec)``.

An embedder has a ``name`` (recorded in the database with every vector), a ``dimension`` and
``embed(texts)`` returning a float32 matrix with one L2-normalized row per text. Three ship with
pgrag: sentence-transformers (the default, all-MiniLM-L6-v2 bundled for offline use), the same
model as int8 ONNX without PyTorch, and any OpenAI-compatible embeddings endpoint.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from pgrag.errors import EmbeddingFailed

Vectors = npt.NDArray[np.float32]

#: The default model's name, shared by its PyTorch and ONNX builds: their vectors are
#: interchangeable (cosine >= 0.999), so switching between them needs no re-embedding.
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_DIMENSION = 384
#: all-MiniLM-L6-v2 reads at most 256 word pieces; longer texts are truncated.
DEFAULT_MAX_TOKENS = 256


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalized float32 vectors of one fixed dimension."""

    @property
    def name(self) -> str:
        """The model's identity, recorded with every vector it makes."""
        ...

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One row per text, in order; raises EmbedError on failure."""
        ...


class EmbedError(EmbeddingFailed):
    """The embedder failed on a batch.

    ``transient`` failures (network, rate limit, server error) are retried with backoff;
    the others (bad response, wrong dimension, a text the model rejects) are not.
    """

    def __init__(self, message: str, *, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after


class Stopped(Exception):
    """A stop was asked for while waiting to retry (SIGINT/SIGTERM in the worker)."""


def check_vectors(name: str, vectors: object, count: int, dimension: int) -> Vectors:
    """``vectors`` as a (count, dimension) float32 matrix of finite, non-zero rows."""
    try:
        matrix = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbedError(
            f"{name} returned something that is not a matrix ({exc})", transient=False
        ) from exc
    if matrix.ndim != 2 or matrix.shape[0] != count:
        raise EmbedError(
            f"{name} returned {matrix.shape[0] if matrix.ndim else 0} vectors for {count} texts",
            transient=False,
        )
    if matrix.shape[1] != dimension:
        raise EmbedError(
            f"{name} returned {matrix.shape[1]}-dimensional vectors, expected {dimension}",
            transient=False,
        )
    if not np.isfinite(matrix).all():
        raise EmbedError(f"{name} returned vectors with NaN or infinite values", transient=False)
    if count and not (np.abs(matrix).sum(axis=1) > 0).all():
        raise EmbedError(f"{name} returned an all-zero vector", transient=False)
    return np.ascontiguousarray(matrix)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for transient failures: base, 2*base, 4*base ... max."""

    attempts: int = 5
    base_s: float = 1.0
    max_s: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        backoff = min(self.max_s, self.base_s * 2 ** (attempt - 1))
        backoff *= 0.5 + random.random() / 2  # jitter: several workers do not retry in step
        if retry_after is not None:
            backoff = max(backoff, min(retry_after, self.max_s))
        return float(backoff)


DEFAULT_RETRY = RetryPolicy()
#: For a question a user waits on: fewer, shorter waits.
QUERY_RETRY = RetryPolicy(attempts=3, base_s=0.5, max_s=5.0)


def _no_stop(seconds: float) -> bool:
    import time

    time.sleep(seconds)
    return False


def embed_with_retry(
    embedder: Embedder,
    texts: Sequence[str],
    policy: RetryPolicy = DEFAULT_RETRY,
    wait: Callable[[float], bool] = _no_stop,
) -> Vectors:
    """``embedder.embed(texts)``, checked, with transient failures retried under ``policy``.

    ``wait(seconds)`` sleeps and returns True if the caller wants to stop (then Stopped is
    raised). Any other exception from the embedder is a non-transient EmbedError.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            raw = embedder.embed(texts)
            return check_vectors(embedder.name, raw, len(texts), embedder.dimension)
        except EmbedError as exc:
            if not exc.transient or attempt >= policy.attempts:
                if exc.transient:
                    raise EmbedError(
                        f"{exc} (gave up after {attempt} attempts)",
                        transient=True,
                        retry_after=exc.retry_after,
                    ) from exc
                raise
            if wait(policy.delay(attempt, exc.retry_after)):
                raise Stopped from exc
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as exc:  # the model itself failed on this input
            raise EmbedError(
                f"{embedder.name} failed: {type(exc).__name__}: {exc}", transient=False
            ) from exc
