"""The demo: migrate, load the sample shop, build and embed its documents, ask four questions.

Sized for a laptop or a 2-core CI box: the default 200 customers make about 2,200 chunks
(200 customer profiles, ~2,000 orders), which the bundled all-MiniLM-L6-v2 embeds in about a
minute on 2 CPU cores; a second run finds every text in the content cache and takes seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgrag.ask import AskResult
    from pgrag.embed.base import Embedder

DEMO_QUESTIONS = (
    "What products did John Smith return?",
    "Who among VIP customers has many returns?",
    "What's the total revenue and average order value for VIP customers?",
    "Which products did customer 123 buy in January 2024 that haven't been delivered yet?",
)
DEFAULT_CUSTOMERS = 200


def _bar(desc: str, total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="chunk",
        disable=None if enabled else True,
        dynamic_ncols=True,
        leave=False,
    )


def run_demo(
    url: str,
    *,
    customers: int = DEFAULT_CUSTOMERS,
    seed: int = 42,
    embedder: str | Embedder | None = None,
    questions: Sequence[str] = DEMO_QUESTIONS,
    say: Callable[[str], None] = print,
    show: Callable[[AskResult], None] | None = None,
    progress: bool = True,
) -> list[AskResult]:
    """Run the whole demo on ``url``; ``say`` gets progress lines, ``show`` each answer."""
    from pgrag import migrate
    from pgrag.connection import connect_once, describe_target
    from pgrag.db import connect
    from pgrag.embed.progress import EmbedProgress
    from pgrag.embed.registry import get_embedder
    from pgrag.lab.sample import load_sample
    from pgrag.lab.sample_documents import declare_sample_documents
    from pgrag.search import query_cache_for
    from pgrag.vocabulary import forget_vocabulary
    from pgrag.worker import Worker

    started = time.perf_counter()
    say(f"database: {describe_target(url)}")
    migrate.upgrade(url)
    say(f"migrated to {migrate.current(url)}")
    loaded = load_sample(url, customers=customers, seed=seed, progress=progress)
    say(
        f"sample shop: {loaded.customers:,} customers, {loaded.orders:,} orders, "
        f"{loaded.order_items:,} items ({loaded.elapsed_s:.1f} s)"
    )
    with connect_once(url, autocommit=False) as conn:
        declare_sample_documents(conn)
        conn.commit()
    forget_vocabulary()
    model = embedder if embedder is not None and not isinstance(embedder, str) else None
    model = model or get_embedder(embedder if isinstance(embedder, str) else None)
    with connect(url) as client:
        bars: dict[str, Any] = {}

        def on_rebuild(doc_type: str, done: int, total: int) -> None:
            bar = bars.get(doc_type)
            if bar is None:
                bar = bars[doc_type] = _bar(f"render {doc_type}", total, progress)
            bar.n = done
            bar.refresh()

        t = time.perf_counter()
        rebuilt = client.rebuild(progress=on_rebuild)
        for bar in bars.values():
            bar.close()
        say(
            "documents: "
            + ", ".join(f"{r.documents:,} {r.doc_type}" for r in rebuilt)
            + f" ({time.perf_counter() - t:.1f} s)"
        )
        t = time.perf_counter()
        say(f"embedding the chunks with {model.name}")
        with Worker(url, model) as worker:
            worker.check()  # loads a local model first: seconds
            queue = worker.queue()
            with EmbedProgress(queue.waiting, enabled=progress) as bar:
                drained = worker.drain(lambda b: bar.update(b.claimed))
        say(
            f"embedded {drained.written:,} chunks: {drained.model_texts:,} through the model, "
            f"{drained.from_cache:,} from the cache ({time.perf_counter() - t:.1f} s)"
        )
        cache = query_cache_for(model)
        results = []
        for q in questions:
            result = client.ask(q, embedder=cache)
            results.append(result)
            if show is not None:
                show(result)
    say(f"\ndemo finished in {time.perf_counter() - started:.1f} s")
    return results


__all__ = ["DEFAULT_CUSTOMERS", "DEMO_QUESTIONS", "run_demo"]
