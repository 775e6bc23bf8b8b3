"""The retrieval strategies an evaluation (pgrag.lab.eval) can run, by name: one list, which
the runner, the strategy benchmark and the eval commands' help read. It lives outside
pgrag.lab.eval, whose package imports its metrics and question sets (15 ms), which the CLI
would then pay to list its commands.

- ``hybrid``: pgrag's ask pipeline: the parsed filters (``filters=False`` drops them) + vector
  + full text + reciprocal rank fusion + exact statistics, then dedup and rerank; its ranking
  is the statement's order.
- ``vector`` / ``text``: one search mode over every document type (or ``doc_types``).
- ``customer_profile``, ``parent_child``, ``table_row``, ``join_row``: plain vector search over
  one chunking of the sample shop (the relationship-preserving profiles; profiles and their
  order children; each table's rows apart; flattened JOIN rows). They isolate the chunking:
  no filters, no full text, no stats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgrag.errors import ConfigError

if TYPE_CHECKING:
    from pgrag.search import Mode


@dataclass(frozen=True)
class Strategy:
    """A way to retrieve: the ask pipeline, or one search mode over fixed document types."""

    name: str
    description: str
    mode: Mode
    doc_types: tuple[str, ...] | None  # None: every type (the parse's, for the pipeline)
    pipeline: bool = False  # the whole ask pipeline (parse, filters, stats, rerank)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "hybrid",
            "pgrag: parsed filters + vector + full text + RRF + exact stats",
            "hybrid",
            None,
            pipeline=True,
        ),
        Strategy("vector", "vector search over every document type", "vector", None),
        Strategy("text", "full-text search over every document type", "text", None),
        Strategy(
            "customer_profile",
            "vector search over relationship-preserving customer profiles",
            "vector",
            ("customer_profile",),
        ),
        Strategy(
            "parent_child",
            "vector search over profiles and their order children (hits with parent)",
            "vector",
            ("customer_profile", "order_detail"),
        ),
        Strategy(
            "table_row",
            "vector search over each table's rows rendered apart",
            "vector",
            ("table_row",),
        ),
        Strategy(
            "join_row",
            "vector search over flattened JOIN rows (one per order item)",
            "vector",
            ("join_row",),
        ),
    )
}


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``, or a ConfigError listing the known ones."""
    found = STRATEGIES.get(name)
    if found is None:
        raise ConfigError(
            f"unknown strategy {name!r}: use one of {', '.join(STRATEGIES)} (docs/evaluation.md)"
        )
    return found


# The chunkings ``pgrag bench strategies`` compares by default, in its table's order.
BENCH_STRATEGIES = ("table_row", "join_row", "customer_profile", "parent_child", "hybrid")

__all__ = ["BENCH_STRATEGIES", "STRATEGIES", "Strategy", "get_strategy"]
