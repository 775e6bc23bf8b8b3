"""``pgrag eval``, ``pgrag eval-runs``, ``pgrag eval-questions`` and ``bench strategies``.

Registered on the main group by ``pgrag/cli/main.py`` (``cli.add_command``); ``COMMANDS`` lists
them; ``bench_strategies`` joins the ``pgrag bench`` group of ``pgrag/cli/bench.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from pgrag.cli.options import (
    CONTEXT_SETTINGS,
    customers_option,
    embedder_option,
    json_option,
    no_progress_option,
    output_option,
    seed_option,
    url_of,
)
from pgrag.lab.strategies import BENCH_STRATEGIES, STRATEGIES, get_strategy


def _bar(desc: str, total: int, enabled: bool = True) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="q" if not desc.startswith("embed") else "chunk",
        disable=None if enabled else True,
        dynamic_ncols=True,
        leave=False,
        file=sys.stderr,
    )


def _write_json(target: str, data: Any) -> None:
    text = json.dumps(data, indent=2, default=str, ensure_ascii=False) + "\n"
    if target == "-":
        click.echo(text, nl=False)
        return
    from pgrag.errors import ConfigError

    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {target}: {exc.strerror}: check the path") from None


def _pct(x: float) -> str:
    return f"{x * 100:5.1f}%"


def print_result(result: Any) -> None:
    """The readable report of an EvalResult: means, breakdowns, latency, faithfulness."""
    r = result.report
    m = r.mean
    click.echo(
        f"{result.question_set} ({result.question_set_sha256[:12]}), strategy {result.strategy}, "
        f"k = {result.k}{', parsed filters' if result.filters else ''}: "
        f"{len(result.questions)} questions, {m.count} scored, {len(r.skipped)} skipped "
        f"(no relevant document), {result.chunks:,} chunks searched"
    )
    click.echo("")
    head = (
        f"{'':<24} {'n':>4} {'hit':>6} {'recall':>6} {'prec':>6} {'F1':>6} {'MRR':>6} {'nDCG':>6}"
    )
    click.echo(head)

    def row(name: str, x: Any) -> None:
        click.echo(
            f"{name[:24]:<24} {x.count:>4} {_pct(x.hit_rate)} {_pct(x.recall)} "
            f"{_pct(x.precision)} {_pct(x.f1)} {x.mrr:6.3f} {x.ndcg:6.3f}"
        )

    row("all", m)
    for label in ("complexity", "category"):
        for value, means in r.by_label.get(label, {}).items():
            row(f"  {label} {value}", means)
    lat = result.latency_ms
    click.echo("")
    click.echo(
        f"latency (retrieval, question embedding excluded): p50 {lat.p50:.1f} ms, "
        f"p95 {lat.p95:.1f} ms, mean {lat.mean:.1f} ms"
    )
    f = result.faithfulness
    kind = "LLM" if f.used_llm else "extractive"
    mean = "n/a" if f.mean is None else f"{f.mean:.3f}"
    click.echo(
        f"faithfulness ({kind} answers, offline check): {mean} over {f.checked} answers with "
        f"claims; {f.unsupported} of {f.claims} claims unsupported"
    )
    if f.judged:
        click.echo(
            f"LLM judge: score {f.judge_mean:.3f}, fully supported {f.judge_fully_supported:.1%}, "
            f"contradicts {f.judge_contradicts:.1%}, outside info {f.judge_outside_info:.1%} "
            f"({f.judged} answers)"
        )
    for q in result.questions:
        if q.unsupported:
            click.echo(f"  unsupported in {q.id}: {', '.join(q.unsupported[:5])}")
    a = result.answers
    recall = "n/a" if a.fact_recall is None else f"{a.fact_recall:.3f}"
    click.echo(
        f"answers: fact recall {recall} ({a.fact_questions} questions), aggregates exact "
        f"{a.aggregates_right}/{a.aggregates}, negatives 'cannot find' "
        f"{a.negatives_right}/{a.negatives}"
    )
    if r.skipped:
        shown = ", ".join(r.skipped[:10]) + (" ..." if len(r.skipped) > 10 else "")
        click.echo(f"skipped: {shown}")
    for note in result.notes:
        click.echo(f"note: {note}")


@click.command("eval", context_settings=CONTEXT_SETTINGS)
@click.argument("questions_file", metavar="QUESTIONS.jsonl", type=click.Path(dir_okay=False))
@click.option(
    "--k", "-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True,
    help="Cutoff: hits retrieved and scored per question.",
)  # fmt: skip
@click.option(
    "--strategy",
    default="hybrid",
    show_default=True,
    metavar="NAME",
    help=f"{', '.join(STRATEGIES)} (hybrid: pgrag's pipeline; docs/evaluation.md).",
)
@click.option(
    "--filters/--no-filters",
    default=True,
    show_default=True,
    help="hybrid: search with the filters parsed from each question, or without any.",
)
@click.option(
    "--doc-type",
    "doc_types",
    multiple=True,
    metavar="TYPE",
    help="Search only this document type (repeatable; overrides the strategy's types).",
)
@json_option("Print the whole result as JSON.")
@output_option("Write the whole result as JSON to FILE.")
@click.option("--store", is_flag=True, help="Insert the run into pgrag.eval_runs.")
@click.option(
    "--llm/--no-llm",
    "use_llm",
    default=True,
    show_default=True,
    help="Answer and judge with the chat endpoint in PGRAG_LLM_MODEL / PGRAG_LLM_BASE_URL when "
    "set (else extractive answers, offline check only).",
)
@embedder_option(
    help="Embedder of the questions (must be the store's model). Env: PGRAG_EMBEDDER."
    " (--model: the same, deprecated.)"
)
@no_progress_option()
@click.pass_context
def eval_command(
    ctx: click.Context,
    questions_file: str,
    k: int,
    strategy: str,
    filters: bool,
    doc_types: tuple[str, ...],
    as_json: bool,
    output: Path | None,
    store: bool,
    use_llm: bool,
    embedder_spec: str | None,
    no_progress: bool,
) -> None:
    """Run a labelled question set (JSONL) through a retrieval strategy and score it.

    Prints hit rate, recall, precision, F1, MRR and nDCG at k (overall, by complexity, by
    category), retrieval latency and the faithfulness of the answers. Make a question set with
    `pgrag eval-questions`.
    """
    json_out = "-" if as_json else (None if output is None else str(output))
    from pgrag.answer import LLMConfig
    from pgrag.db import connect
    from pgrag.lab.eval.questions import read_jsonl
    from pgrag.lab.eval.runner import run_eval, sha256_of, store_run

    strat = get_strategy(strategy)  # before reading the file or starting anything
    path = Path(questions_file)
    questions = read_jsonl(path)
    llm = LLMConfig.from_env() if use_llm else None
    quiet = no_progress or json_out == "-"
    with connect(url_of(ctx)) as client:
        client.require_schema()
        bar = _bar(f"eval {strat.name}", len(questions), not quiet)
        with client.connection() as conn:
            result = run_eval(
                conn,
                questions,
                strat,
                k=k,
                filters=filters,
                doc_types=list(doc_types) or None,
                question_set=path.stem,
                question_set_sha256=sha256_of(path),
                llm=llm,
                embedder=None if strat.mode == "text" else embedder_spec,
                progress=lambda _done, _total: bar.update(1),
            )
            bar.close()
            run_id = store_run(conn, result) if store else None
    if json_out is not None:
        data = result.to_json()
        if run_id is not None:
            data["eval_run_id"] = run_id
        _write_json(json_out, data)
    if json_out != "-":
        print_result(result)
        if run_id is not None:
            click.echo(f"stored as pgrag.eval_runs id {run_id}")


@click.command("eval-runs", context_settings=CONTEXT_SETTINGS)
@click.option("--question-set", metavar="NAME", help="Only runs of this question set.")
@click.option("--strategy", metavar="NAME", help="Only runs of this strategy.")
@click.option(
    "--limit", type=click.IntRange(1, 100_000), default=20, show_default=True,
    help="Newest runs to show.",
)  # fmt: skip
@json_option("Print JSON lines, one run each.")
@click.pass_context
def eval_runs(
    ctx: click.Context, question_set: str | None, strategy: str | None, limit: int, as_json: bool
) -> None:
    """List stored evaluation runs (pgrag.eval_runs), newest first."""
    from pgrag.db import connect
    from pgrag.lab.eval.runner import list_runs

    with connect(url_of(ctx)) as client:
        client.require_schema()
        with client.connection() as conn:
            runs = list_runs(conn, question_set=question_set, strategy=strategy, limit=limit)
    if as_json:
        for r in runs:
            click.echo(json.dumps(r.__dict__, default=str, ensure_ascii=False))
        return
    if not runs:
        click.echo("no stored runs: run `pgrag eval QUESTIONS.jsonl --store`")
        return
    click.echo(
        f"{'id':>5}  {'created':<16}  {'question set':<20} {'strategy':<16} {'k':>3} {'n':>4} "
        f"{'hit':>6} {'recall':>6} {'nDCG':>6} {'p95 ms':>7} {'faith':>6}"
    )
    for r in runs:
        m, lat, f = r.metrics, r.latency_ms or {}, r.faithfulness or {}
        faith = f.get("mean")
        click.echo(
            f"{r.id:>5}  {r.created_at:%Y-%m-%d %H:%M}  {r.question_set[:20]:<20} "
            f"{r.strategy[:16]:<16} {r.k:>3} {r.questions:>4} {_pct(m.get('hit_rate', 0))} "
            f"{_pct(m.get('recall', 0))} {m.get('ndcg', 0):6.3f} {lat.get('p95', 0):7.1f} "
            f"{'   n/a' if faith is None else f'{faith:6.3f}'}"
        )


@click.command("eval-questions", context_settings=CONTEXT_SETTINGS)
@click.argument("out", metavar="OUT.jsonl", type=click.Path(dir_okay=False))
@click.option(
    "--set",
    "kind",
    type=click.Choice(["shop", "northwind", "clubdata", "type"]),
    default="shop",
    show_default=True,
    help="shop: schema shop's templates; northwind: Northwind's; clubdata: the club's "
    "(examples/clubdata); type: one per chunk of --doc-type, by a unique metadata value.",
)
@click.option("--limit-per-template", type=click.IntRange(1, 10_000), default=20, show_default=True,
              help="Questions per template (type: questions per document type).")  # fmt: skip
@seed_option(42, "Sample and wording seed.")
@click.option("--doc-type", "doc_types", multiple=True, metavar="TYPE",
              help="--set type: the document types to ask about (repeatable).")  # fmt: skip
@click.pass_context
def eval_questions(
    ctx: click.Context,
    out: str,
    kind: str,
    limit_per_template: int,
    seed: int,
    doc_types: tuple[str, ...],
) -> None:
    """Generate a labelled question set with SQL ground truth and write it as JSONL."""
    from pgrag.db import connect
    from pgrag.errors import ConfigError
    from pgrag.lab.eval.clubdata import generate_clubdata_questions
    from pgrag.lab.eval.northwind import generate_northwind_questions
    from pgrag.lab.eval.questions import (
        generate_shop_questions,
        generate_type_questions,
        write_jsonl,
    )

    if kind == "type" and not doc_types:
        raise ConfigError("--set type needs --doc-type TYPE (repeatable): the types to ask about")
    with connect(url_of(ctx)) as client:
        client.require_schema()
        with client.connection() as conn:
            if kind == "shop":
                qs = generate_shop_questions(conn, limit_per_template=limit_per_template, seed=seed)
            elif kind == "northwind":
                qs = generate_northwind_questions(
                    conn, limit_per_template=limit_per_template, seed=seed
                )
            elif kind == "clubdata":
                qs = generate_clubdata_questions(
                    conn, limit_per_template=limit_per_template, seed=seed
                )
            else:
                qs = [
                    q
                    for t in doc_types
                    for q in generate_type_questions(conn, t, limit_per_template, seed=seed)
                ]
    try:
        write_jsonl(out, qs)
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror}: check the path") from None
    scored = sum(1 for q in qs if q.relevant)
    click.echo(f"wrote {len(qs)} questions ({scored} with relevant documents) to {out}")


# ---------------------------------------------------------------- bench


@click.command("strategies", context_settings=CONTEXT_SETTINGS)
@customers_option(help="Sample shop size (27 order items per customer).")
@seed_option(42, "Sample and question seed.")
@click.option(
    "--limit-per-template", type=click.IntRange(1, 10_000), default=20, show_default=True,
    help="Questions per question template.",
)  # fmt: skip
@click.option(
    "--strategy",
    "strategies",
    multiple=True,
    metavar="NAME",
    help=f"Evaluate only this strategy (repeatable; default: {', '.join(BENCH_STRATEGIES)}).",
)
@click.option(
    "--reuse", is_flag=True,
    help="Keep the loaded shop and its chunks if it has --customers customers (no reload).",
)  # fmt: skip
@json_option("Print the results as JSON.")
@output_option("Also write the results as JSON to FILE.")
@click.option("--questions-out", metavar="FILE", help="Write the generated question set (JSONL).")
@embedder_option(
    help="Embedder (default: the bundled all-MiniLM-L6-v2). Env: PGRAG_EMBEDDER."
    " (--model: the same, deprecated.)"
)
@no_progress_option()
@click.pass_context
def bench_strategies(
    ctx: click.Context,
    customers: int,
    seed: int,
    limit_per_template: int,
    strategies: tuple[str, ...],
    reuse: bool,
    as_json: bool,
    output: Path | None,
    questions_out: str | None,
    embedder_spec: str | None,
    no_progress: bool,
) -> None:
    """Compare chunking strategies on the sample shop, table rows to hybrid search.

    The strategies: table rows, JOIN rows, profiles, profiles + orders, and pgrag's full
    hybrid search. Replaces schema shop (like `pgrag sample load --comparisons`), renders and
    embeds every type once, generates the shop's question set and prints a markdown table:
    P/R/F1/hit rate at 5, MRR, nDCG@10, latency, chunks, index time, faithfulness of
    extractive answers.
    """
    json_out = "-" if as_json else (None if output is None else str(output))
    from pgrag.lab.eval.bench import markdown, run_strategy_bench
    from pgrag.lab.eval.questions import write_jsonl

    for name in strategies:
        get_strategy(name)
    to_stdout = json_out == "-"

    def say(line: str) -> None:
        click.echo(line, err=True)

    result = run_strategy_bench(
        url_of(ctx),
        customers=customers,
        seed=seed,
        limit_per_template=limit_per_template,
        strategies=list(strategies) or list(BENCH_STRATEGIES),
        reuse=reuse,
        embedder=embedder_spec,
        say=say,
        bar=None if no_progress else (lambda desc, total: _bar(desc, total)),
        questions_out=(lambda qs: write_jsonl(questions_out, qs)) if questions_out else None,
    )
    if json_out is not None:
        _write_json(json_out, result.to_json())
    if not to_stdout:
        click.echo(markdown(result), nl=False)


COMMANDS = (eval_command, eval_runs, eval_questions)  # bench_strategies: pgrag/cli/bench.py
