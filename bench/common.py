"""What the synthetic-store benchmarks share: their arguments and the store they load."""

from __future__ import annotations

import argparse
import os

from pgrag.connection import resolve_url
from pgrag.lab import synthetic


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
