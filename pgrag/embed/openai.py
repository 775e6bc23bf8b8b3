"""Any OpenAI-compatible embeddings endpoint: OpenAI, Azure OpenAI (v1 API), vLLM, Ollama ...

Configured by argument or environment: ``PGRAG_OPENAI_BASE_URL`` (else ``OPENAI_BASE_URL``,
else OpenAI), the key from ``PGRAG_OPENAI_API_KEY`` or ``OPENAI_API_KEY`` (a local server needs
none), ``PGRAG_OPENAI_DIMENSIONS`` (sent as ``dimensions``; otherwise the model's own size),
``PGRAG_OPENAI_BATCH_SIZE`` (inputs per request, default 256). The HTTP client does not retry:
rate limits (429), server errors (5xx) and network failures become transient EmbedErrors, which
``embed_with_retry`` retries with backoff (honouring Retry-After).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from pgrag import config
from pgrag.embed.base import EmbedError, Vectors, check_vectors
from pgrag.errors import ConfigError, MissingDependency

ENV_BASE_URL = "PGRAG_OPENAI_BASE_URL"
ENV_API_KEY = "PGRAG_OPENAI_API_KEY"
ENV_DIMENSIONS = "PGRAG_OPENAI_DIMENSIONS"
ENV_BATCH_SIZE = "PGRAG_OPENAI_BATCH_SIZE"
INSTALL_HINT = "pip install 'pgrag-relational[openai]'"

#: Native sizes of OpenAI's models; others are asked once (a one-text request).
KNOWN_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}


def _env_int(name: str) -> int | None:
    raw = config.env(name)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < 1:
        raise ConfigError(f"{name}={raw!r} must be 1 or more")
    return value


class OpenAIEmbedder:
    """Embeddings through the ``openai`` package; the name recorded is ``openai:<model>``."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        dimensions: int | None = None,
        batch_size: int = 256,
        timeout_s: float = 60.0,
    ) -> None:
        try:
            import openai
        except ImportError as exc:
            raise MissingDependency(f"the openai package is not installed: {INSTALL_HINT}") from exc
        if api_key is None and base_url is None:
            raise ConfigError(
                "no API key for OpenAI: set OPENAI_API_KEY, or PGRAG_OPENAI_BASE_URL for a "
                "local server (vLLM, Ollama ...)"
            )
        self._openai = openai
        self._client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or "unused",  # local servers ignore it; the client wants one
            max_retries=0,
            timeout=timeout_s,
        )
        self._model = model
        self._requested_dimensions = dimensions
        self._dimension = dimensions or KNOWN_DIMENSIONS.get(model)
        self._batch_size = batch_size
        self._where = base_url or "api.openai.com"

    @classmethod
    def from_env(cls, model: str) -> OpenAIEmbedder:
        base_url = config.env(ENV_BASE_URL) or os.environ.get("OPENAI_BASE_URL") or None
        api_key = config.env(ENV_API_KEY) or os.environ.get("OPENAI_API_KEY") or None
        return cls(
            model,
            base_url=base_url,
            api_key=api_key,
            dimensions=_env_int(ENV_DIMENSIONS),
            batch_size=_env_int(ENV_BATCH_SIZE) or 256,
        )

    @property
    def name(self) -> str:
        return f"openai:{self._model}"

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            vectors = self._request(["dimension probe"])
            self._dimension = int(vectors.shape[1])
        return self._dimension

    def embed(self, texts: Sequence[str]) -> Vectors:
        dim = self.dimension
        parts = [
            self._request(list(texts[i : i + self._batch_size]))
            for i in range(0, len(texts), self._batch_size)
        ]
        if not parts:
            return np.zeros((0, dim), dtype=np.float32)
        matrix = check_vectors(self.name, np.concatenate(parts), len(texts), dim)
        # Some servers (Ollama, vLLM) return unnormalized vectors; pgrag's are unit length.
        normalized: Vectors = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
        return normalized

    def _request(self, batch: list[str]) -> Vectors:
        oa = self._openai
        kwargs: dict[str, Any] = {"model": self._model, "input": batch, "encoding_format": "float"}
        if self._requested_dimensions is not None:
            kwargs["dimensions"] = self._requested_dimensions
        try:
            response = self._client.embeddings.create(**kwargs)
        except oa.APIStatusError as exc:
            status = exc.status_code
            transient = status == 429 or status >= 500 or status == 408
            fix = ""
            if status in (401, 403):
                fix = ": check OPENAI_API_KEY / PGRAG_OPENAI_API_KEY"
            elif status == 404:
                fix = f": check the model name {self._model!r} and PGRAG_OPENAI_BASE_URL"
            raise EmbedError(
                f"{self._where} answered {status} {_short(exc.message)}{fix}",
                transient=transient,
                retry_after=_retry_after(exc.response.headers),
            ) from exc
        except oa.APIConnectionError as exc:  # includes timeouts
            raise EmbedError(
                f"cannot reach {self._where} ({_short(str(exc))})", transient=True
            ) from exc
        except oa.APIError as exc:  # a body the client cannot read
            raise EmbedError(
                f"{self._where} sent a bad response ({_short(str(exc))})", transient=False
            ) from exc
        data = getattr(response, "data", None)
        if not isinstance(data, list) or len(data) != len(batch):
            got = len(data) if isinstance(data, list) else "no"
            raise EmbedError(
                f"{self._where} returned {got} embeddings for {len(batch)} texts", transient=False
            )
        rows = sorted(data, key=lambda d: int(getattr(d, "index", 0)))
        if [int(getattr(d, "index", -1)) for d in rows] != list(range(len(batch))):
            raise EmbedError(f"{self._where} returned embeddings with bad indexes", transient=False)
        try:
            matrix = np.array([d.embedding for d in rows], dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EmbedError(
                f"{self._where} returned embeddings that are not lists of numbers ({exc})",
                transient=False,
            ) from exc
        dim = self._dimension or (matrix.shape[1] if matrix.ndim == 2 else 0)
        return check_vectors(self.name, matrix, len(batch), dim)


def _short(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:200]


def _retry_after(headers: Any) -> float | None:
    """Seconds from Retry-After / retry-after-ms, if the server sent a number."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
        sec = headers.get("retry-after")
        if sec is not None:
            return max(0.0, float(sec))
    except (TypeError, ValueError):
        return None
    return None
