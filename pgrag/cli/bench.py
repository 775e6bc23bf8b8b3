"""``pgrag bench``: benchmarks that write their results into the docs.

Registered on the main group by ``pgrag/cli/main.py``.
"""

from __future__ import annotations

from pathlib import Path

import click

from pgrag import config
from pgrag.cli.options import CONTEXT_SETTINGS, Group, url_of


@click.group("bench", cls=Group, context_settings=CONTEXT_SETTINGS)
def bench() -> None:
    """Benchmarks whose markdown and plots go into docs/."""


def _add_strategies() -> None:
    from pgrag.cli.eval import bench_strategies

    bench.add_command(bench_strategies)


_add_strategies()


@bench.command("search", context_settings=CONTEXT_SETTINGS)
@click.option(
    "--rows",
    "sizes",
    type=click.IntRange(1_000, 10_000_000),
    multiple=True,
    default=(100_000, 1_000_000),
    show_default=True,
    help="Store sizes to sweep (repeatable); one database pgrag_bench_<rows> each.",
)
@click.option("--queries", type=click.IntRange(5, 10_000), default=50, show_default=True)
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--reload", is_flag=True, help="Reload the synthetic chunks even if present.")
@click.option(
    "--output-dir",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("docs"),
    show_default=True,
    help="Writes search-sweep.md and img/search-sweep-<rows>.png here (--out: the same, "
    "deprecated).",
)
@click.option(
    "--hnsw-m",
    type=click.IntRange(config.MIN_HNSW_M, config.MAX_HNSW_M),
    help="Build the index with this m (its own database pgrag_bench_<rows>_m<m>_efc<efc>).",
)
@click.option(
    "--hnsw-ef-construction",
    type=click.IntRange(config.MIN_HNSW_EF_CONSTRUCTION, config.MAX_HNSW_EF_CONSTRUCTION),
    help="Likewise.",
)
@click.option(
    "--tune",
    is_flag=True,
    help="First run pgrag tune on 50 held-out synthetic questions (stored in the query cache) "
    "and store the ef_search it finds.",
)
@click.option(
    "--filter-indexes",
    is_flag=True,
    help="Give the 10% and 1% filters a filter index (pgrag filter-index add) before the run; "
    "without it, any filter index is dropped first. Writes search-sweep-...-filter-indexes.md.",
)
@click.option(
    "--quantized",
    "quantized_kind",
    type=click.Choice(["halfvec", "bit"]),
    help="Also time bare pgvector over a quantized HNSW index (halfvec: 16-bit floats; bit: "
    "binary_quantize) with an exact re-rank of its candidates, beside the plain index's rows "
    "(the index is built once and kept; without this option it is dropped first: it takes "
    "shared_buffers from the plain one). Tens of minutes at 1,000,000 chunks.",
)
@click.pass_context
def bench_search(
    ctx: click.Context,
    sizes: tuple[int, ...],
    queries: int,
    k: int,
    reload: bool,
    out_dir: Path,
    hnsw_m: int | None,
    hnsw_ef_construction: int | None,
    tune: bool,
    filter_indexes: bool,
    quantized_kind: str | None,
) -> None:
    """Sweep search recall and latency on synthetic stores; write docs/search-sweep.md.

    Recall@k and p50/p95/p99 latency for ef_search 20/40/100/200/400, with and without the
    iterative scan, at 100%, 10%, 1% and 0.1% filters, bare pgvector beside pgrag's default,
    plus the end-to-end stage breakdown (embed, search, rerank).

    Each size gets its own database on the server (pgrag_bench_<rows>, synthetic chunks,
    created and migrated on first use, reused after). Loading 1,000,000 chunks and building
    their HNSW index takes tens of minutes on 2 cores; the sweep itself, minutes.
    """
    from pgrag.cli.options import rebuild_progress
    from pgrag.lab.sweep import cache_warnings, run

    command = "pgrag bench search " + " ".join(f"--rows {n}" for n in sizes)
    out_name = "search-sweep.md"
    if hnsw_m or hnsw_ef_construction:
        m, efc = hnsw_m or 16, hnsw_ef_construction or 64
        command += f" --hnsw-m {m} --hnsw-ef-construction {efc}"
        out_name = f"search-sweep-m{m}-efc{efc}.md"
    if tune:
        command += " --tune"
    if filter_indexes:
        command += " --filter-indexes"
        out_name = out_name.removesuffix(".md") + "-filter-indexes.md"
    if quantized_kind:
        command += f" --quantized {quantized_kind}"
    reports = run(
        url_of(ctx),
        sizes,
        out_dir=out_dir,
        queries=queries,
        k=k,
        reload=reload,
        hnsw_m=hnsw_m,
        hnsw_ef_construction=hnsw_ef_construction,
        command=command,
        out_name=out_name,
        progress=rebuild_progress("step"),
        tune=tune,
        filter_indexes=filter_indexes,
        quantized_kind=quantized_kind,
    )
    for rep in reports:
        ours = [r for r in rep.results if r.engine == "pgrag"]
        summary = ", ".join(f"{r.selectivity} {r.recall:.3f} / {r.p95_ms:.1f} ms" for r in ours)
        click.echo(f"{rep.rows:,} chunks, pgrag recall / p95: {summary}")
        for warning in cache_warnings(rep):
            click.echo(f"warning: {warning}", err=True)
    md, img = out_dir / out_name, out_dir / "img"
    click.echo(f"wrote {md} and {len(reports)} plot(s) in {img}")
