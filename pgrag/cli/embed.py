"""``pgrag embed``, ``pgrag worker``, ``pgrag reembed``: parse, call pgrag.worker, print.

Registered on the main group by ``pgrag.cli.main``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import click

from pgrag.cli.options import embedder_option, url_of
from pgrag.embed.base import Embedder
from pgrag.embed.progress import EmbedProgress
from pgrag.errors import EmbeddingFailed
from pgrag.tune import TuneResult
from pgrag.worker import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_POLL_S,
    BatchResult,
    DrainResult,
    Reconnect,
    RenderResult,
    StopOnSignals,
    Worker,
)

SHOWN_FAILURES = 5

F = TypeVar("F", bound=Callable[..., Any])


def _embedder(spec: str | None) -> Embedder:
    from pgrag.embed.registry import get_embedder

    return get_embedder(spec)


def _batch_option() -> Callable[[F], F]:
    return click.option(
        "--batch-size",
        type=click.IntRange(1, 4096),
        default=DEFAULT_BATCH_SIZE,
        show_default=True,
        help="Chunks claimed, embedded and written together.",
    )


def _drain_with_progress(worker: Worker, total: int) -> DrainResult:
    """Drain the queue behind a bar on a terminal, plain periodic lines elsewhere (logs)."""
    with EmbedProgress(total) as progress:

        def on_batch(b: BatchResult) -> None:
            progress.update(b.claimed)

        return worker.drain(on_batch)


def _stopped(ctx: click.Context, result: DrainResult, command: str) -> None:
    """After a SIGINT or SIGTERM: the batch in flight was finished and kept; exit 130."""
    click.echo(
        f"pgrag: interrupted: the {result.written} chunks embedded are kept; "
        f"run `{command}` again to embed the rest",
        err=True,
    )
    ctx.exit(130)


def _tuned(result: TuneResult) -> str:
    """The recall measurement the run took (the store doubled or halved), in one line."""
    top = max(result.points, key=lambda p: p.recall)
    chosen = (
        f"ef_search {result.chosen} reaches recall@{result.k} {result.target:g}"
        if result.chosen is not None
        else f"no ef_search reaches recall@{result.k} {result.target:g} (best "
        f"{top.recall:.3f}): the index graph is the limit; `pgrag reindex` rebuilds it for the "
        "store's size, as `pgrag worker` does (docs/search.md, 'The graph')"
    )
    where = f"{result.chunks:,} chunks on {result.queries} {result.source}"
    return f"measured recall at {where}: {chosen}"


def _summary(result: DrainResult) -> str:
    rate = result.claimed / result.seconds if result.seconds > 0 else 0.0
    text = (
        f"embedded {result.written} chunks in {result.seconds:.1f} s ({rate:.0f}/s): "
        f"{result.model_texts} texts through the model, {result.from_cache} from the cache"
    )
    if result.changed:
        text += f"; {result.changed} changed while embedding (queued again)"
    return text


def _report_failures(worker: Worker, result: DrainResult, given_up: int) -> None:
    if given_up:
        click.echo(
            f"{given_up} chunks skipped after repeated failures: "
            "`pgrag embed --retry-failed` tries them again",
            err=True,
        )
    if not result.failures:
        return
    for f in result.failures[:SHOWN_FAILURES]:
        click.echo(f"  chunk {f.chunk_id}: {f.error}", err=True)
    more = len(result.failures) - SHOWN_FAILURES
    if more > 0:
        click.echo(f"  ... and {more} more (table pgrag.embed_errors)", err=True)
    first = result.failures[0].error
    if result.outage:
        raise EmbeddingFailed(
            f"the embedder {worker.embedder.name} is failing ({first}); {len(result.failures)} "
            "chunks stay queued: fix the cause and run `pgrag embed` again"
        )
    raise EmbeddingFailed(
        f"{len(result.failures)} chunks could not be embedded (first: {first}): fix the cause "
        "(see pgrag.embed_errors), then run `pgrag embed --retry-failed`"
    )


@click.command("embed")
@embedder_option()
@_batch_option()
@click.option("--retry-failed", is_flag=True, help="Forget recorded failures and try them again.")
@click.pass_context
def embed(
    ctx: click.Context, embedder_spec: str | None, batch_size: int, retry_failed: bool
) -> None:
    """Embed every chunk waiting for a vector, with a progress bar, then exit.

    The bar shows the rate and the time left; when stderr is not a terminal (a log, a pipe),
    a plain line does instead, at every tenth of the work and at least every 30 s. Exits 9 if
    some chunks could not be embedded (they are listed), 5 if the model is not the one that
    made this store's vectors (see `pgrag reembed`), 130 on Ctrl-C (SIGINT) or SIGTERM, after
    the batch in flight, whose vectors are kept.
    """
    url = url_of(ctx)
    embedder = _embedder(embedder_spec)
    stop = threading.Event()
    with (
        Worker(url, embedder, batch_size=batch_size, stop=stop, auto_reindex=False) as worker,
        StopOnSignals(stop),
    ):
        worker.check()
        if retry_failed:
            click.echo(f"forgot {worker.clear_errors()} recorded failures", err=True)
        queue = worker.queue()
        if queue.waiting == 0 and queue.retrying == 0:
            click.echo(f"nothing to embed ({embedder.name})")
            _report_failures(worker, DrainResult(), queue.given_up)
            return
        result = _drain_with_progress(worker, queue.waiting)
        click.echo(_summary(result))
        if worker.last_tune is not None:
            click.echo(_tuned(worker.last_tune))
        if result.stopped:
            _stopped(ctx, result, "pgrag embed")
        _report_failures(worker, result, worker.queue().given_up)


@click.command("worker")
@embedder_option()
@_batch_option()
@click.option(
    "--poll",
    "poll_s",
    type=click.FloatRange(0.1, 3600),
    default=DEFAULT_POLL_S,
    show_default=True,
    help="Seconds between queue checks when no NOTIFY arrives (a burst of writers notifies "
    "once; the worker looks again right after each batch).",
)
@click.option(
    "--no-reindex",
    is_flag=True,
    help="Never rebuild the store index when the store outgrows its graph (say so instead).",
)
@click.pass_context
def worker(
    ctx: click.Context,
    embedder_spec: str | None,
    batch_size: int,
    poll_s: float,
    no_reindex: bool,
) -> None:
    """Keep rendering and embedding as writes arrive, until SIGINT or SIGTERM.

    Wakes on NOTIFY (pgrag_render, pgrag_chunks), renders the documents waiting in the render
    queue, then embeds what changed.

    After embedding, it measures ef_search when the store doubled or halved. When no value
    reaches the recall target and the store has outgrown its index's graph (m 16 past 500,000
    vectors), it rebuilds the index for the store's size, concurrently, as `pgrag reindex`
    does: run it as the owner of pgrag.chunks, with the server's maintenance_work_mem large
    enough for the graph (ALTER ROLE ... SET maintenance_work_mem), or pass --no-reindex.

    Stops cleanly on SIGINT or SIGTERM after its current batch (a second signal interrupts).
    Any number of workers may run at once. A lost connection (the server restarting, a
    failover) is retried with backoff, 1 s doubling to 60 s, for as long as it takes.
    """
    url = url_of(ctx)
    embedder = _embedder(embedder_spec)
    stop = threading.Event()
    with (
        Worker(
            url,
            embedder,
            batch_size=batch_size,
            stop=stop,
            auto_reindex=not no_reindex,
            notice=lambda line: click.echo(line, err=True),
        ) as w,
        StopOnSignals(stop),
    ):
        w.check()
        click.echo(f"pgrag worker: {embedder.name}, listening on pgrag_chunks", err=True)

        def on_batch(b: BatchResult) -> None:
            line = (
                f"embedded {b.written}/{b.claimed} chunks in {b.seconds:.2f} s "
                f"({b.model_texts} through the model, {b.from_cache} cached)"
            )
            if b.changed:
                line += f", {b.changed} changed meanwhile"
            if b.failures:
                line += f", {len(b.failures)} failed: {b.failures[0].error}"
            click.echo(line, err=True)

        def on_reconnect(r: Reconnect) -> None:
            if r.error is None:
                click.echo(f"pgrag worker: connected again after {r.attempt} attempts", err=True)
                return
            reason = str(r.error).strip().splitlines()[0] if str(r.error).strip() else "closed"
            click.echo(
                f"pgrag worker: lost the database ({reason}); trying again in "
                f"{r.delay_s:.1f} s (attempt {r.attempt})",
                err=True,
            )

        def on_render(r: RenderResult) -> None:
            click.echo(
                f"rendered {r.entries} queued entries in {r.seconds:.2f} s ({r.chunks} chunks "
                f"written; the oldest had waited {r.oldest_s:.2f} s)",
                err=True,
            )

        result = w.run_forever(
            on_batch, poll_s=poll_s, on_reconnect=on_reconnect, on_render=on_render
        )
    click.echo(f"pgrag worker: stopped after {result.written} chunks", err=True)


@click.command("reembed")
@embedder_option(required=True)
@_batch_option()
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--no-embed",
    is_flag=True,
    help="Only switch the model and queue every chunk; leave the embedding to workers.",
)
@click.pass_context
def reembed(
    ctx: click.Context, embedder_spec: str, batch_size: int, yes: bool, no_embed: bool
) -> None:
    """Switch the store to another model: drop every vector, then embed again.

    Vectors the model made before come back from the content cache for free; search returns
    fewer chunks until the re-embedding is done.
    """
    url = url_of(ctx)
    embedder = _embedder(embedder_spec)
    if not yes:
        click.confirm(
            f"drop every vector and re-embed with {embedder.name} ({embedder.dimension} d)?",
            abort=True,
        )
    stop = threading.Event()
    with (
        Worker(url, embedder, batch_size=batch_size, stop=stop, auto_reindex=False) as w,
        StopOnSignals(stop),
    ):
        queued = w.begin_reembed()
        click.echo(
            f"store switched to {embedder.name} ({embedder.dimension} d); {queued} chunks queued"
        )
        if no_embed:
            return
        result = _drain_with_progress(w, queued)
        click.echo(_summary(result))
        if result.stopped:
            _stopped(ctx, result, "pgrag embed")
        _report_failures(w, result, w.queue().given_up)


COMMANDS = (embed, worker, reembed)
