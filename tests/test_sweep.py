"""pgrag bench search: the sweep on a small synthetic store, its markdown and its plot."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from pgrag.lab import quantized, sweep, synthetic

from .conftest import run_pgrag


def test_sweep_reports_every_configuration_and_writes_markdown_and_plot(
    db_url: str, tmp_path: Path
) -> None:
    synthetic.load(db_url, 3_000, quiet=True)
    with psycopg.connect(db_url) as conn:
        assert synthetic.loaded(conn) == 3_000
    rep = sweep.sweep_size(db_url, queries=5, ef_values=(20, 40), stages=False)
    assert rep.rows == 3_000 and rep.queries == 5
    bare = [r for r in rep.results if r.engine == "pgvector"]
    ours = [r for r in rep.results if r.engine == "pgrag"]
    columns = [r for r in rep.results if r.engine == sweep.COLUMNS_ENGINE]
    assert len(bare) == 4 * 2 * 2 and len(ours) == 4 and len(columns) == 4
    # the bare statement returning pgrag's columns finds what the bare statement finds
    for col in columns:
        same = next(
            r
            for r in bare
            if r.selectivity == col.selectivity and r.ef_search == 40 and r.iterative
        )
        assert col.iterative and col.ef_search is not None and col.rows_mean == same.rows_mean
    assert {r.selectivity for r in ours} == set(synthetic.SELECTIVITIES)
    for r in ours:  # pgrag always returns k rows, exactly when the filter is selective
        assert r.rows_min == min(
            10, 3_000 // {"100%": 1, "10%": 10, "1%": 100, "0.1%": 1000}[r.selectivity]
        )
        assert 0.0 <= r.recall <= 1.0 and r.p50_ms <= r.p99_ms
    assert next(r for r in ours if r.selectivity == "1%").scan == "exact"
    # bare pgvector really runs on the index (an exact scan would return 10 rows): without
    # the iterative scan, a 10% filter leaves about ef_search / 10 of its candidates
    plain = next(
        r for r in bare if r.selectivity == "10%" and r.ef_search == 20 and not r.iterative
    )
    assert plain.rows_mean < 10
    # the 0.1% filter keeps 3 rows: all of them are the exact answer, for everyone
    tiny = [r for r in rep.results if r.selectivity == "0.1%"]
    assert all(r.rows_min <= 3 for r in tiny) and all(r.recall == 1.0 for r in tiny if r.rows_min)
    sweep.plot(rep, tmp_path / "img" / "x.png")
    assert (tmp_path / "img" / "x.png").read_bytes()[:4] == b"\x89PNG"
    md = sweep.markdown([rep], "pgrag bench search --rows 3000")
    assert "| 10% | pgvector | 40 | yes |" in md and "| 10% | pgrag | pgrag | yes |" in md
    assert "prewarmed into shared_buffers" in rep.memory and rep.memory in md
    # every configuration ran once, untimed, before the timed queries: pgrag's first search of
    # each filter's shape (it plans and prepares it) is reported apart, not in its rows
    assert set(rep.pgrag_first_ms) == set(synthetic.SELECTIVITIES)
    assert all(ms > 0 for ms in rep.pgrag_first_ms.values())
    assert "pgrag's first search of each filter's shape" in md
    # the ratio to the fastest bare configuration that reaches pgrag's recall, per filter
    compared = {c.selectivity: c for c in sweep.compare_at_recall(rep.results)}
    assert set(compared) == set(synthetic.SELECTIVITIES)
    for c in compared.values():
        mine = next(r for r in ours if r.selectivity == c.selectivity)
        if c.bare_p95 is not None:
            rival = [r for r in bare if r.selectivity == c.selectivity and r.p95_ms == c.bare_p95]
            assert rival and max(r.recall for r in rival) >= mine.recall - 0.005
            assert c.ratio == round(mine.p95_ms / c.bare_p95, 2)
            assert f"| {c.ratio:.2f}x |" in md
        same = next(r for r in columns if r.selectivity == c.selectivity)
        assert c.columns_p95 == same.p95_ms and c.columns_ratio == round(
            mine.p95_ms / same.p95_ms, 2
        )


def test_compare_at_recall_picks_the_fastest_bare_row_at_that_recall() -> None:
    def row(engine: str, ef: int | None, it: bool, recall: float, p95: float) -> sweep.Row:
        return sweep.Row(engine, "10%", ef, it, 10, 10, recall, p95 / 2, p95, p95 * 2)

    rows = [
        row("pgvector", 20, True, 0.90, 2.0),  # fast, but short of pgrag's recall
        row("pgvector", 100, False, 0.995, 5.0),
        row("pgvector", 100, True, 0.999, 4.0),  # the fastest at that recall
        row("pgvector", 200, True, 1.0, 8.0),
        row("pgrag", None, True, 0.996, 6.0),
    ]
    (c,) = sweep.compare_at_recall(rows)
    assert (c.bare, c.bare_p95, c.ratio) == ("ef 100, iterative", 4.0, 1.5)
    (none,) = sweep.compare_at_recall([row("pgvector", 20, True, 0.5, 1.0), rows[-1]])
    assert none.bare_p95 is None and none.ratio is None


def test_stage_breakdown_times_embed_search_and_rerank(db_url: str) -> None:
    synthetic.load(db_url, 1_000, quiet=True)
    name, by_filter = sweep.stage_breakdown(db_url, queries=3, k=5, filters={"10%": {"p10": True}})
    assert "pass-through" in name and set(by_filter) == {"10%"}
    stages = by_filter["10%"]
    assert set(stages) == {"statement", "cached", "embed", "search", "rerank", "total", "hits"}
    # statistics computed with the cache off, found in it on, end to end too
    assert stages["hits"] == {"statement": 0, "cached": 3, "end to end": 3, "of": 3}
    assert stages["embed"]["p50"] > 0 and stages["total"]["p95"] >= stages["search"]["p50"]
    assert stages["statement"]["p50"] > 0 and stages["cached"]["p50"] > 0
    # the statistics cache is off again afterwards, and held one result while on
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "select cache_deps from pgrag.doc_stats where doc_type = 'synthetic'"
        ).fetchone()
    assert row == (None,)


def test_a_stage_that_recomputed_is_reported() -> None:
    hits = {"statement": 0.0, "cached": 50.0, "end to end": 49.0, "of": 50.0}
    stage = {"p50": 1.0, "p95": 1.0, "p99": 1.0}
    rep = sweep.SizeReport(
        rows=1000, queries=50, k=10, results=(), stages={"10%": {"cached": stage, "hits": hits}}
    )
    (line,) = sweep.cache_warnings(rep)
    assert "10%: some end to end statements recomputed" in line
    full = dict(hits, **{"end to end": 50.0})
    assert sweep.cache_warnings(dataclasses.replace(rep, stages={"10%": {"hits": full}})) == []


def test_cli_bench_search_writes_into_the_output_directory(pg_server: Any, tmp_path: Path) -> None:
    out = run_pgrag(
        "--database-url",
        pg_server.url_for("postgres"),
        "bench",
        "search",
        "--rows",
        "1000",
        "--queries",
        "5",
        "--out",
        str(tmp_path),
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "1,000 chunks, pgrag recall / p95" in out.stdout
    assert (tmp_path / "search-sweep.md").exists()
    assert (tmp_path / "img" / "search-sweep-1000.png").exists()
    with psycopg.connect(pg_server.url_for("postgres"), autocommit=True) as conn:
        conn.execute("drop database pgrag_bench_1000")


def test_bench_tunes_on_held_out_questions_not_on_chunk_vectors(db_url: str) -> None:
    synthetic.load(db_url, 2_000, quiet=True)
    note = sweep.tune_on_questions(db_url, 10)
    assert note.startswith("`pgrag tune` on 50 held-out questions (40: ")
    with psycopg.connect(db_url) as conn:
        asked = conn.execute(
            "select count(*) from pgrag.query_cache where model = 'synthetic'"
        ).fetchone()
        assert asked == (50,)
        # the sweep's own queries are another draw: tuning never sees the test set
        held_out, _ = synthetic.queries(50, seed=13)
        test_set, _ = synthetic.queries(50)
        assert not np.allclose(held_out[0], test_set[0])


def test_the_quantized_index_gets_rows_beside_the_plain_one_and_goes_when_not_asked(
    db_url: str,
) -> None:
    synthetic.load(db_url, 3_000, quiet=True)
    note = sweep.set_quantized(db_url, "halfvec")
    assert "halfvec(384)" in note and "built in" in note
    assert "existing" in sweep.set_quantized(db_url, "halfvec")  # kept for the next run
    rep = sweep.sweep_size(
        db_url, queries=5, ef_values=(20, 40, 100), stages=False, quantized_kind="halfvec"
    )
    engine = sweep.quantized_engine("halfvec")
    rows = [r for r in rep.results if r.engine == engine]
    # one row per ef_search that holds the candidates, under every filter, iterative
    assert {(r.selectivity, r.ef_search) for r in rows} == {
        (s, ef) for s in synthetic.SELECTIVITIES for ef in (40, 100)
    }
    assert all(r.iterative for r in rows)
    for r in rows:  # the exact re-rank of a halfvec walk finds the exact answer on 3,000 chunks
        expected = min(10, 3_000 // {"100%": 1, "10%": 10, "1%": 100, "0.1%": 1000}[r.selectivity])
        assert r.rows_min == expected and r.recall >= 0.9
    md = sweep.markdown([dataclasses.replace(rep, quantized=note)], "pgrag bench search")
    assert f"| 10% | {engine} | 40 | yes |" in md and note in md
    # compared with pgrag, bare pgvector is still the plain index's rows
    assert all(c.bare == "" or "ef" in c.bare for c in sweep.compare_at_recall(rep.results))
    # a run without it drops it, and says so; so does a reload (the load would be slow)
    assert "halfvec index of an earlier run dropped" in sweep.set_quantized(db_url, None)
    assert sweep.set_quantized(db_url, None) == ""
    sweep.set_quantized(db_url, "halfvec")
    synthetic.load(db_url, 1_000, quiet=True)
    with psycopg.connect(db_url) as conn:
        assert quantized.present(conn) == []
