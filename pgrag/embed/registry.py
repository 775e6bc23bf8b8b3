"""Which embedder a spec names: the one place that maps ``PGRAG_EMBEDDER`` / ``--embedder``
values to the embedder classes (imported only when named: PyTorch loads only if asked for)."""

from __future__ import annotations

from pgrag.config import ENV_EMBEDDER, env
from pgrag.embed.base import DEFAULT_MODEL, Embedder
from pgrag.errors import ConfigError

SPEC_FORMS = (
    "sentence-transformers (the default: all-MiniLM-L6-v2, bundled), "
    "sentence-transformers:<local path or cached model name>, onnx (the same model, int8, no "
    "PyTorch), onnx:<directory with model.onnx and tokenizer.json>, openai:<model>"
)


def get_embedder(spec: str | None = None) -> Embedder:
    """The embedder ``spec`` names, else ``PGRAG_EMBEDDER``, else the bundled default.

    Forms: ``sentence-transformers`` (or ``st``, ``all-MiniLM-L6-v2``),
    ``sentence-transformers:<local path or cached model name>``, ``onnx``,
    ``onnx:<directory with model.onnx and tokenizer.json>``, ``openai:<model>`` (endpoint, key
    and dimensions from PGRAG_OPENAI_BASE_URL, OPENAI_API_KEY, PGRAG_OPENAI_DIMENSIONS).
    """
    raw = (spec or env(ENV_EMBEDDER) or "sentence-transformers").strip()
    kind, _, arg = raw.partition(":")
    kind = kind.strip().lower()
    arg = arg.strip()
    if kind in {"sentence-transformers", "st", "default", "all-minilm-l6-v2"} or (
        raw == DEFAULT_MODEL
    ):
        from pgrag.embed.sentence_transformers import SentenceTransformerEmbedder

        if raw == DEFAULT_MODEL:
            arg = ""
        return SentenceTransformerEmbedder(arg or None)
    if kind == "onnx":
        from pgrag.embed.onnx import OnnxEmbedder

        if arg.lower() in {"", "all-minilm-l6-v2", DEFAULT_MODEL.lower()}:
            return OnnxEmbedder()
        return OnnxEmbedder.from_directory(arg)
    if kind == "openai":
        from pgrag.embed.openai import OpenAIEmbedder

        if not arg:
            raise ConfigError(
                f"embedder {raw!r} names no model: use e.g. openai:text-embedding-3-small"
            )
        return OpenAIEmbedder.from_env(arg)
    raise ConfigError(f"unknown embedder {raw!r}: use one of {SPEC_FORMS}")
