"""Retrieval evaluation on Northwind, a schema nobody at pgrag wrote. Prints markdown.

    python bench/northwind_eval.py [--northwind PATH] [--limit-per-template 20] [--seed 42]
                                   [--questions-out nw.jsonl] [--json OUT] [--keep]

Against the server of PGRAG_DATABASE_URL (default: the embedded server), in a scratch database
`pgrag_northwind_eval` it creates (and drops unless --keep): loads Northwind (default
examples/northwind/northwind.sql, or PGRAG_NORTHWIND_SQL) with psql, migrates pgrag,
declares the documents of examples/northwind/documents.sql, embeds them with the default model,
generates the Northwind question set (pgrag.lab.eval.northwind, SQL ground truth in
sql/eval/northwind_questions.sql) and evaluates four strategies with the same credit rule as
the shop (order_id -> nw_order, customer_id -> nw_customer):

- hybrid: pgrag's ask pipeline (the parser knows the shop's vocabulary, not Northwind's: on
  Northwind it contributes the search text and exact-stats detection, no metadata filters);
- vector: vector search over nw_customer and nw_order (profiles + order children);
- nw_customer: vector search over the customer profiles only;
- text: full-text search over both types.

The same numbers come from the CLI: `pgrag eval-questions nw.jsonl --set northwind`, then
`pgrag eval nw.jsonl --strategy hybrid` (or vector, text, or vector --doc-type nw_customer).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg import sql

from pgrag import migrate
from pgrag.connection import resolve_url
from pgrag.embed.registry import get_embedder
from pgrag.lab.eval.bench import embed_type, result_markdown
from pgrag.lab.eval.metrics import evaluate
from pgrag.lab.eval.northwind import generate_northwind_questions
from pgrag.lab.eval.questions import labels, qrels, write_jsonl
from pgrag.lab.eval.runner import NORTHWIND_ENTITIES, run_eval
from pgrag.lab.strategies import STRATEGIES, Strategy
from pgrag.server import bin_dir

DB = "pgrag_northwind_eval"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_NORTHWIND = Path(
    os.environ.get("PGRAG_NORTHWIND_SQL", REPO / "examples" / "northwind" / "northwind.sql")
)
STRATS = (
    STRATEGIES["hybrid"],
    Strategy("vector", "vector search over nw_customer and nw_order", "vector", None),
    Strategy("nw_customer", "vector search over customer profiles", "vector", ("nw_customer",)),
    STRATEGIES["text"],
)


def psql_file(url: str, path: Path) -> None:
    subprocess.run(
        [str(bin_dir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--northwind", type=Path, default=DEFAULT_NORTHWIND)
    ap.add_argument("--limit-per-template", type=int, default=20)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--questions-out", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = ap.parse_args()

    admin_url = resolve_url(None)
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=DB)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB)))
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(DB)))
    started = time.perf_counter()
    try:
        psql_file(url, args.northwind)
        migrate.upgrade(url)
        t = time.perf_counter()
        psql_file(url, REPO / "examples" / "northwind" / "documents.sql")
        render_s = time.perf_counter() - t
        embedder = get_embedder(None)
        lines = []
        with psycopg.connect(url, autocommit=True) as conn:
            embedded = 0
            per_type: dict[str, float] = {}
            for doc_type in ("nw_customer", "nw_order"):
                n, seconds = embed_type(conn, embedder, doc_type)
                embedded += n
                per_type[doc_type] = seconds
            embed_s = sum(per_type.values())
            # documents.sql renders both types in one go: its time counts for every strategy
            index_s = {
                s.name: render_s + sum(per_type[t] for t in (s.doc_types or per_type))
                for s in STRATS
            }
            questions = generate_northwind_questions(
                conn, limit_per_template=args.limit_per_template, seed=args.seed
            )
            if args.questions_out:
                write_jsonl(args.questions_out, questions)
            judged = qrels(questions)
            scored = sum(1 for q in questions if q.relevant)
            results, at5 = {}, {}
            for strat in STRATS:
                r = run_eval(
                    conn,
                    questions,
                    strat,
                    k=10,
                    question_set=f"northwind-seed{args.seed}",
                    entity_keys=NORTHWIND_ENTITIES,
                    embedder=embedder,
                )
                results[strat.name] = r
                at5[strat.name] = evaluate(judged, r.run, 5, labels=labels(questions))
        lines.append(
            f"Northwind: 91 customers, 830 orders; {embedded:,} chunks rendered in "
            f"{render_s:.1f} s "
            f"and embedded in {embed_s:.1f} s ({embedder.name}); {len(questions)} questions, "
            f"{scored} with relevant documents; {time.perf_counter() - started:.0f} s in all"
        )
        lines.append("")
        lines.append(result_markdown(results, at5, index_s))
        lines.append("Recall@5 by category:")
        lines.append("")
        cats = sorted({c for r in at5.values() for c in r.by_category})
        lines.append("| category (questions) | " + " | ".join(results) + " |")
        lines.append("|---|" + "---:|" * len(results))
        for c in cats:
            n = next(r.by_category[c].count for r in at5.values() if c in r.by_category)
            cells = [
                f"{r.by_category[c].recall * 100:.1f}%" if c in r.by_category else ""
                for r in at5.values()
            ]
            lines.append(f"| {c} ({n}) | " + " | ".join(cells) + " |")
        print("\n".join(lines))
        if args.json:
            args.json.write_text(
                json.dumps({k: r.to_json() for k, r in results.items()}, indent=2, default=str)
            )
    finally:
        if not args.keep:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DB))
                )


if __name__ == "__main__":
    main()
