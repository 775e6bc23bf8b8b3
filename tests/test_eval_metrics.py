"""pgrag.lab.eval.metrics: hand-computed cases, and the same runs scored by ir-measures."""

from __future__ import annotations

import math
import random

import pytest

from pgrag.errors import ConfigError
from pgrag.lab.eval.metrics import (
    Means,
    Ranking,
    dcg_at_k,
    evaluate,
    f1_at_k,
    hit_rate_at_k,
    ndcg_at_k,
    precision_at_k,
    ranked,
    recall_at_k,
    reciprocal_rank,
)

L2 = math.log2


def test_binary_case_by_hand() -> None:
    judged = {"a": 1, "b": 1, "c": 1}
    ranking = ["x", "a", "y", "b"]
    assert hit_rate_at_k(ranking, judged, 1) == 0.0
    assert hit_rate_at_k(ranking, judged, 2) == 1.0
    assert recall_at_k(ranking, judged, 4) == pytest.approx(2 / 3)
    assert precision_at_k(ranking, judged, 4) == pytest.approx(0.5)
    # P = 1/2, R = 2/3 -> F1 = 2 * (1/3) / (7/6) = 4/7
    assert f1_at_k(ranking, judged, 4) == pytest.approx(4 / 7)
    assert reciprocal_rank(ranking, judged) == pytest.approx(0.5)
    assert reciprocal_rank(ranking, judged, 1) == 0.0
    dcg = 1 / L2(3) + 1 / L2(5)
    idcg = 1 + 1 / L2(3) + 1 / L2(4)
    assert ndcg_at_k(ranking, judged, 4) == pytest.approx(dcg / idcg)


def test_precision_divides_by_k_even_when_fewer_were_retrieved() -> None:
    assert precision_at_k(["a"], {"a": 1}, 10) == pytest.approx(0.1)


def test_graded_relevance_linear_and_exponential_gain() -> None:
    judged = {"a": 3, "b": 2, "c": 1, "z": 0}
    ranking = ["c", "z", "a", "b"]
    dcg = 1 / L2(2) + 0 + 3 / L2(4) + 2 / L2(5)
    idcg = 3 + 2 / L2(3) + 1 / L2(4)
    assert ndcg_at_k(ranking, judged, 4) == pytest.approx(dcg / idcg)
    dcg_e = 1 / L2(2) + 7 / L2(4) + 3 / L2(5)
    idcg_e = 7 + 3 / L2(3) + 1 / L2(4)
    assert ndcg_at_k(ranking, judged, 4, "exponential") == pytest.approx(dcg_e / idcg_e)
    # the ideal ranking is cut at k as well
    assert ndcg_at_k(ranking, judged, 1) == pytest.approx(1 / 3)
    assert ndcg_at_k(["a", "b", "c"], judged, 3) == pytest.approx(1.0)
    # grade 0 is judged but not relevant
    assert recall_at_k(ranking, judged, 4) == pytest.approx(1.0)
    assert hit_rate_at_k(["z"], judged, 1) == 0.0


def test_ties_in_grades_give_the_same_ideal() -> None:
    judged = {"a": 1, "b": 1}
    assert ndcg_at_k(["a", "b"], judged, 2) == ndcg_at_k(["b", "a"], judged, 2) == 1.0
    assert ndcg_at_k(["b"], judged, 1) == 1.0


def test_ties_in_scores_break_by_doc_id_descending_as_trec_eval() -> None:
    assert ranked({"a": 1.0, "b": 1.0, "c": 2.0}) == ["c", "b", "a"]
    assert reciprocal_rank({"a": 1.0, "b": 1.0}, {"a": 1}) == 0.5
    assert reciprocal_rank({"a": 1.0, "b": 1.0}, {"b": 1}) == 1.0


def test_duplicates_count_once_at_their_first_rank() -> None:
    assert ranked(["a", "b", "a", "c"]) == ["a", "b", "c"]
    assert precision_at_k(["a", "a"], {"a": 1}, 2) == 0.5


def test_empty_run_and_idcg_zero() -> None:
    for fn in (hit_rate_at_k, recall_at_k, precision_at_k, f1_at_k, ndcg_at_k):
        assert fn([], {"a": 1}, 5) == 0.0
        assert fn(["a"], {}, 5) == 0.0  # nothing relevant: IDCG 0, recall 0
        assert fn(["a"], {"a": 0}, 5) == 0.0
    assert reciprocal_rank([], {"a": 1}) == 0.0
    assert dcg_at_k([], 3) == 0.0


def test_bad_arguments_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match="k must be an integer >= 1"):
        recall_at_k(["a"], {"a": 1}, 0)
    with pytest.raises(ConfigError, match="unknown gain"):
        ndcg_at_k(["a"], {"a": 1}, 1, "cubic")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="wrap it in a list"):
        ranked("abc")


def test_evaluate_means_breakdowns_missing_and_skipped_queries() -> None:
    qrels = {
        "q1": {"a": 1},
        "q2": {"b": 1, "c": 1},
        "q3": {"d": 1},  # no run at all: scores 0
        "q4": {},  # nothing relevant: skipped
        "q5": {"e": 0},  # nothing relevant: skipped
    }
    run: dict[str, Ranking] = {
        "q1": ["a"],
        "q2": {"x": 2.0, "c": 1.0},
        "q9": ["zzz"],
    }  # q9 is not judged
    labels = {
        "q1": {"complexity": "simple", "category": "returns"},
        "q2": {"complexity": "medium", "category": "returns"},
        "q3": {"complexity": "simple", "category": "orders"},
    }
    report = evaluate(qrels, run, 2, labels=labels)
    assert report.skipped == ("q4", "q5")
    assert [s.query_id for s in report.per_query] == ["q1", "q2", "q3"]
    q2 = report.per_query[1]
    assert (q2.hit_rate, q2.recall, q2.precision, q2.mrr) == (1.0, 0.5, 0.5, 0.5)
    assert q2.relevant == 2 and q2.retrieved == 2
    assert report.mean.count == 3
    assert report.mean.hit_rate == pytest.approx(2 / 3)
    assert report.mean.recall == pytest.approx((1 + 0.5 + 0) / 3)
    assert report.mean.mrr == pytest.approx((1 + 0.5 + 0) / 3)
    assert set(report.by_complexity) == {"simple", "medium"}
    assert report.by_complexity["simple"].count == 2
    assert report.by_complexity["simple"].hit_rate == pytest.approx(0.5)
    assert report.by_category["returns"].recall == pytest.approx(0.75)
    assert report.by_category["orders"] == Means(1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert evaluate({}, {}, 3).mean == Means(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


# ---- the same runs scored by ir-measures (pytrec_eval, i.e. trec_eval underneath) ----


def _random_case(
    rng: random.Random, graded: bool
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    docs = [f"d{i:02d}" for i in range(30)]
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for q in range(40):
        qid = f"q{q}"
        judged = rng.sample(docs, rng.randint(1, 8))
        grades = {d: (rng.randint(0, 3) if graded else rng.randint(0, 1)) for d in judged}
        grades[judged[0]] = max(grades[judged[0]], 1)  # at least one relevant doc
        qrels[qid] = grades
        retrieved = rng.sample(docs, rng.randint(0, 15))
        # integer scores so ties happen and the doc-id tie break is exercised
        run[qid] = {d: float(rng.randint(0, 5)) for d in retrieved}
    return qrels, run


@pytest.mark.parametrize("graded", [False, True])
@pytest.mark.parametrize("k", [1, 3, 10])
def test_matches_ir_measures_on_random_runs(graded: bool, k: int) -> None:
    ir_measures = pytest.importorskip("ir_measures")
    from ir_measures import RR, P, R, Success, nDCG

    qrels, run = _random_case(random.Random(1000 * k + graded), graded)
    exp = nDCG(gains={g: 2**g - 1 for g in range(4)}) @ k
    # One measure per call: given nDCG@k and nDCG(gains=...)@k together, ir-measures 0.4.3
    # applies the custom gains to both.
    theirs: dict[tuple[str, str], float] = {}
    for measure in (Success @ k, R @ k, P @ k, nDCG @ k, exp):
        for m in ir_measures.iter_calc([measure], qrels, run):
            theirs[(m.query_id, str(measure))] = m.value
    # RR@k is not pytrec_eval's (it has only the uncut RR) and its provider breaks score ties
    # another way: hand it our ranking as distinct scores.
    distinct = {q: {d: -float(i) for i, d in enumerate(ranked(r))} for q, r in run.items()}
    for m in ir_measures.iter_calc([RR @ k], qrels, distinct):
        theirs[(m.query_id, str(RR @ k))] = m.value
    report = evaluate(qrels, run, k)
    report_exp = evaluate(qrels, run, k, gain="exponential")
    assert report.skipped == ()
    for ours, ours_exp in zip(report.per_query, report_exp.per_query, strict=True):
        q = ours.query_id
        assert ours.hit_rate == pytest.approx(theirs[(q, str(Success @ k))]), q
        assert ours.recall == pytest.approx(theirs[(q, str(R @ k))]), q
        assert ours.precision == pytest.approx(theirs[(q, str(P @ k))]), q
        assert ours.mrr == pytest.approx(theirs[(q, str(RR @ k))]), q
        assert ours.ndcg == pytest.approx(theirs[(q, str(nDCG @ k))]), q
        assert ours_exp.ndcg == pytest.approx(theirs[(q, str(exp))]), q
    agg = ir_measures.calc_aggregate([nDCG @ k, R @ k], qrels, run)
    assert report.mean.ndcg == pytest.approx(agg[nDCG @ k])
    assert report.mean.recall == pytest.approx(agg[R @ k])
    assert report_exp.mean.ndcg == pytest.approx(ir_measures.calc_aggregate([exp], qrels, run)[exp])


def test_matches_ir_measures_unbounded_reciprocal_rank() -> None:
    ir_measures = pytest.importorskip("ir_measures")
    from ir_measures import RR

    qrels, run = _random_case(random.Random(7), graded=False)
    theirs = {m.query_id: m.value for m in ir_measures.iter_calc([RR], qrels, run)}
    for qid, judged in qrels.items():
        assert reciprocal_rank(run[qid], judged) == pytest.approx(theirs[qid]), qid
