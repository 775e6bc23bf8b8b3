"""What the benchmarks share: the synthetic stores' arguments and load, and the write path's
stand-in for the worker's text index (TextIndexer)."""

from __future__ import annotations

import argparse
import os
import threading
from typing import Any

from pgrag.connection import resolve_url
from pgrag.lab import synthetic
from pgrag.worker import Worker


def synthetic_store(doc: str) -> tuple[argparse.Namespace, str]:
    """``--rows`` (100,000), ``--queries`` (200) and ``--skip-load``, parsed; the URL of
    PGRAG_DATABASE_URL (default: the embedded server), its chunks replaced by ``--rows``
    synthetic ones unless ``--skip-load``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--skip-load", action="store_true")
    args = ap.parse_args()
    url = resolve_url(os.environ.get("PGRAG_DATABASE_URL"))
    if not args.skip_load:
        synthetic.load(url, args.rows)
    return args, url


class NoModel:
    """The write-path benchmarks embed nothing: a worker needs an embedder to exist."""

    name = "bench:none"
    dimension = 384

    def embed(self, texts: Any) -> Any:  # noqa: ARG002
        raise RuntimeError("the write-path benchmarks do not embed")


class TextIndexer:
    """What a running worker does for the write path (since revision 0011): fill in the
    tsvectors a render at a writer's commit left (``Worker.index_text_batch``; only the commits
    of sessions with ``pgrag.tsvector = worker`` leave them, and only while something fills them
    in, which this tells them) and move the GIN pending lists. The write-path benchmarks
    run no embedder; this thread stands in for that part of the worker, on the same cores as
    the writers. Use as a context manager around the measured writes."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.worker = Worker(url, NoModel(), auto_tune=False, auto_reindex=False)

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.worker.index_text_batch():
                self.stop.wait(0.5)

    def __enter__(self) -> TextIndexer:
        self.worker.open()
        self.worker.index_text_batch()  # (recorded before the first write)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        self.worker.close()
