"""``pgrag search``, ``pgrag ask``, ``pgrag demo``: parse arguments, call the library, print.

Registered on the main group by ``pgrag.cli.main``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from pgrag.cli.options import (
    CONTEXT_SETTINGS,
    customers_option,
    embedder_option,
    json_option,
    seed_option,
    url_of,
)
from pgrag.errors import ConfigError
from pgrag.limits import MAX_K

F = TypeVar("F", bound=Callable[..., Any])
PREVIEW_CHARS = 160


def _common(f: F) -> F:
    options = [
        click.option(
            "--filter",
            "filter_json",
            metavar="JSON",
            help='Metadata filter, e.g. \'{"status": "open", "total": {"$gt": 100}}\' '
            "(docs/filters-and-answers.md).",
        ),
        click.option(
            "--doc-type",
            "doc_types",
            multiple=True,
            metavar="TYPE",
            help="Search only this document type (repeatable).",
        ),
        click.option(
            "-k",
            "k",
            type=click.IntRange(1, MAX_K),
            default=10,
            show_default=True,
            help="Results to retrieve.",
        ),
        json_option("Print one JSON object."),
        embedder_option(
            help="Embedder of the question (must be the store's model). Env: PGRAG_EMBEDDER. "
            "(--model: the same, deprecated.)"
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _filter(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    from pgrag.filters import parse_filter_json

    return parse_filter_json(raw)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _dump(value: Any) -> str:
    return json.dumps(_jsonable(value), indent=2, default=str, ensure_ascii=False)


def _preview(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= PREVIEW_CHARS else one[: PREVIEW_CHARS - 1] + "…"


def _timings(t: dict[str, float]) -> str:
    return ", ".join(f"{k.removesuffix('_ms')} {v:.1f} ms" for k, v in t.items())


def _stats_cache(cached: dict[str, bool] | None) -> str:
    """Which types' statistics were statistics-cache hits, for the timings line."""
    if not cached:
        return ""
    hits = sorted(t for t, hit in cached.items() if hit)
    computed = sorted(t for t, hit in cached.items() if not hit)
    parts = []
    if hits:
        parts.append("statistics cache hit: " + ", ".join(hits))
    if computed:
        parts.append("statistics computed: " + ", ".join(computed))
    return "; " + "; ".join(parts)


def print_hits(hits: Any) -> None:
    for h in hits:
        ranks = f"vector #{h.vector_rank}" if h.vector_rank else ""
        if h.text_rank:
            ranks += (", " if ranks else "") + f"text #{h.text_rank}"
        click.echo(f"[chunk {h.id}] {h.doc_type} {h.source_key}  score {h.score:.4f} ({ranks})")
        click.echo(f"    {_preview(h.text)}")
        if h.parent_source_key is not None:
            click.echo(f"    parent {h.parent_source_key}: {_preview(h.parent_text or '')}")


@click.command("search", context_settings=CONTEXT_SETTINGS)
@click.argument("query")
@_common
@click.option(
    "--mode",
    type=click.Choice(["hybrid", "vector", "text"]),
    default="hybrid",
    show_default=True,
    help="hybrid: vector + full text fused; text needs no model.",
)
@click.option(
    "--match",
    type=click.Choice(["any", "all", "phrase"]),
    default="any",
    show_default=True,
    help="Full text: any word (for questions), all words (web search syntax), or the phrase.",
)
@click.option("--stats", is_flag=True, help="Add exact statistics over every matching row.")
@click.pass_context
def search(
    ctx: click.Context,
    query: str,
    filter_json: str | None,
    doc_types: tuple[str, ...],
    k: int,
    as_json: bool,
    embedder_spec: str | None,
    mode: str,
    match: str,
    stats: bool,
) -> None:
    """Search the chunks in one SQL statement (filters, HNSW, full text, stats).

    Vector and full-text ranks are fused. Exits 6 when a --doc-type is not declared, 7 on an
    invalid --filter.
    """
    from pgrag.db import connect

    if not query.strip():
        raise ConfigError(
            "the search query is empty: give the words to look for, e.g. "
            "`pgrag search 'late delivery'`"
        )
    flt = _filter(filter_json)
    with connect(url_of(ctx)) as client:
        result = client.search(
            query,
            filter=flt,
            doc_types=list(doc_types) or None,
            k=k,
            mode=mode,  # type: ignore[arg-type]
            match=match,  # type: ignore[arg-type]
            stats=stats,
            embedder=None if mode == "text" else embedder_spec,
        )
    if as_json:
        click.echo(_dump(result))
        return
    print_hits(result.hits)
    if not result.hits:
        click.echo("no chunks matched")
    if result.stats is not None:
        click.echo("stats: " + json.dumps(result.stats, default=str))
    cache = "" if result.cache_hit is None else f", query cache {result.cache_source}"
    click.echo(
        f"{len(result.hits)} hits, {result.scan} scan{cache}: {_timings(result.timings)}"
        f"{_stats_cache(result.stats_cached)}"
    )


def print_answer(result: Any) -> None:
    click.echo(result.answer.text)
    click.echo("")
    click.echo("sources:")
    for h in result.hits:
        click.echo(f"  [chunk {h.id}] {h.doc_type} {h.source_key}: {_preview(h.text)}")
    if not result.hits:
        click.echo("  (none)")
    if result.stats:
        click.echo("stats: " + json.dumps(result.stats, default=str))
    click.echo(f"filter: {json.dumps(result.filter, default=str)}")
    for note in result.notes:
        click.echo(f"note: {note}")
    cache = (
        "" if result.cache_hit is None else f"; query cache {'hit' if result.cache_hit else 'miss'}"
    )
    click.echo(f"timings: {_timings(result.timings)}{cache}{_stats_cache(result.stats_cached)}")


@click.command("ask", context_settings=CONTEXT_SETTINGS)
@click.argument("question")
@_common
@click.option(
    "--stats/--no-stats",
    default=None,
    help="Force exact statistics on or off (default: when the question asks numbers).",
)
@click.option(
    "--top-n",
    type=click.IntRange(1, 100),
    default=5,
    show_default=True,
    help="Hits given to the answer after dedup and rerank.",
)
@click.pass_context
def ask(
    ctx: click.Context,
    question: str,
    filter_json: str | None,
    doc_types: tuple[str, ...],
    k: int,
    as_json: bool,
    embedder_spec: str | None,
    stats: bool | None,
    top_n: int,
) -> None:
    """Answer a question: parse, embed, one-statement search, rerank, grounded answer.

    Uses PGRAG_LLM_MODEL / PGRAG_LLM_BASE_URL when set, else an extractive answer. Exits 6
    when a --doc-type is not declared, 7 on an invalid --filter.
    """
    from pgrag.db import connect

    flt = _filter(filter_json)
    with connect(url_of(ctx)) as client:
        result = client.ask(
            question,
            k=k,
            top_n=top_n,
            filter=flt,
            doc_types=list(doc_types) or None,
            stats=stats,
            embedder=embedder_spec,
        )
    if as_json:
        click.echo(_dump(result))
        return
    print_answer(result)


@click.command("demo", context_settings=CONTEXT_SETTINGS)
@customers_option()
@seed_option(42, "Sample shop seed.")
@embedder_option(
    help="Embedder (default: the bundled all-MiniLM-L6-v2). Env: PGRAG_EMBEDDER."
    " (--model: the same, deprecated.)"
)
@click.option(
    "--question",
    "questions",
    multiple=True,
    metavar="TEXT",
    help="Ask this instead of the four demo questions (repeatable).",
)
@json_option("Print the answers as JSON lines.")
@click.pass_context
def demo(
    ctx: click.Context,
    customers: int,
    seed: int,
    embedder_spec: str | None,
    questions: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run the whole demo: server, sample shop, documents, embeddings, questions.

    Starts the embedded server (unless --database-url or PGRAG_DATABASE_URL), migrates, loads
    and renders the sample shop, embeds it (progress, rate and time left on stderr), then asks
    the demo questions.
    """
    from pgrag.lab.demo import DEMO_QUESTIONS, run_demo

    def say(line: str) -> None:
        if not as_json:
            click.echo(line)

    def show(result: Any) -> None:
        if as_json:
            click.echo(json.dumps(_jsonable(result), default=str, ensure_ascii=False))
            return
        click.echo("")
        click.echo(f"Q: {result.question}")
        print_answer(result)

    run_demo(
        url_of(ctx),
        customers=customers,
        seed=seed,
        embedder=embedder_spec,
        questions=list(questions) or list(DEMO_QUESTIONS),
        say=say,
        show=show,
        progress=not as_json,
    )


@click.command("tune", context_settings=CONTEXT_SETTINGS)
@click.option(
    "--target",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.95,
    show_default=True,
    help="Mean recall@k against exact search to reach.",
)
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option(
    "--queries",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="Query vectors: recent questions from the query cache, else sampled chunks.",
)
@click.option("--dry-run", is_flag=True, help="Measure and report; store nothing.")
@click.option("--reset", is_flag=True, help="Remove the stored value and exit.")
@json_option("Print one JSON object.")
@click.pass_context
def tune(
    ctx: click.Context,
    target: float,
    k: int,
    queries: int,
    dry_run: bool,
    reset: bool,
    as_json: bool,
) -> None:
    """Size HNSW ef_search to this store: the smallest value reaching the target.

    Computes the exact top-k of each query vector (index disabled), then walks ef_search
    40, 50, 60, ... 1000 (steps of 10 up to 150, then about 10% to 300) through the index until
    the mean recall@k reaches --target, and stores it as the store's (pgrag.settings.ef_search,
    the measurement in pgrag.tuning), which every search without an explicit ef_search uses at
    once. The worker does the same by itself when the store doubles or halves. Exact search
    reads every vector: at 1,000,000 chunks allow a few seconds per query.
    """
    from pgrag.cli.options import rebuild_progress
    from pgrag.db import connect
    from pgrag.tune import MIN_QUESTIONS, override, store
    from pgrag.tune import tune as run

    with connect(url_of(ctx)) as client, client.connection() as conn:
        if reset:
            store(conn, None)
            click.echo("the store's ef_search removed: searches use 2 x candidates (at least 40)")
            still = override(conn)
            if still is not None:
                click.echo(
                    f"note: pgrag.ef_search = {still} is still set for this database or role "
                    "(only its owner may reset it): `alter database <db> reset pgrag.ef_search`",
                    err=True,
                )
            return
        result = run(
            conn,
            k=k,
            target=target,
            queries=queries,
            apply=not dry_run,
            progress=None if as_json else rebuild_progress("step"),
        )
        overridden = override(conn)
    if as_json:
        click.echo(_dump(result))
        return
    click.echo(
        f"{result.chunks:,} chunks, {result.queries} query vectors from {result.source}, "
        f"recall@{result.k} against exact search:"
    )
    click.echo("ef_search  recall  p50 ms  p95 ms")
    for p in result.points:
        click.echo(f"{p.ef_search:>9}  {p.recall:6.3f}  {p.p50_ms:6.2f}  {p.p95_ms:6.2f}")
    if result.chosen is None:
        best = max(result.points, key=lambda p: p.recall)
        click.echo(
            f"no ef_search up to 1000 reaches recall {target} (best {best.recall:.3f} at "
            f"{best.ef_search}); nothing stored. The index graph is the limit: rebuild it with "
            "larger m / ef_construction (docs/search.md, 'Tuning')."
        )
        ctx.exit(1)
    verb = "stored as the store's" if result.applied else "not stored (--dry-run)"
    click.echo(f"ef_search {result.chosen}: {verb} (was {result.previous or 'unset'})")
    if overridden is not None and overridden != result.chosen:
        click.echo(
            f"note: pgrag.ef_search = {overridden} is set for this database or role and overrides "
            "the store's value: the owner runs `alter database <db> reset pgrag.ef_search` (or "
            "`alter role <role> reset pgrag.ef_search`)",
            err=True,
        )
    if result.source == "chunks":
        click.echo(
            "note: chunk vectors are already in the graph, so new questions get lower recall at "
            "the same ef_search (1,000,000 synthetic chunks: 0.954 against 0.842 at 60); run "
            f"pgrag tune again once the query cache holds {MIN_QUESTIONS} questions"
        )


COMMANDS = (search, ask, demo, tune)
