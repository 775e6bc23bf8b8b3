"""The answer checks of `pgrag eval` (pgrag/lab/eval/answers.py): negatives, aggregates, facts."""

from __future__ import annotations

from pgrag.lab.eval.answers import check_answer, summarize_answers
from pgrag.lab.eval.questions import NOT_FOUND, REFUSAL


def test_a_negative_is_right_only_when_the_answer_says_it_cannot_find() -> None:
    right = check_answer(NOT_FOUND, "edge", NOT_FOUND + ".")
    wrong = check_answer(NOT_FOUND, "edge", "Customer Zebulon Smith bought a lamp.")
    assert right is not None and right.kind == "negative" and right.score == 1.0
    assert wrong is not None and wrong.score == 0.0


def test_an_aggregate_is_held_to_its_headline_statistic() -> None:
    answer = "Exact answer: club_member.total_cost = 70.00\n\n- club_member.booking_count: 41"
    c = check_answer("$70.00 (41 bookings, 60 slots)", "aggregates", answer)
    assert c is not None and c.score == 1.0
    # the right number elsewhere does not make a wrong headline right
    answer = "Exact answer: club_member.booking_count = 41\n- club_member.total_cost: 70.00"
    c = check_answer("$70.00 (41 bookings, 60 slots)", "aggregates", answer)
    assert c is not None and c.score == 0.0 and c.missing == ("70.00",)
    # without a headline, any number of the answer
    c = check_answer("$1,234.50", "aggregates", "revenue: 1234.5")
    assert c is not None and c.score == 1.0


def test_fact_recall_counts_items_whose_words_and_numbers_are_all_there() -> None:
    c = check_answer(
        "Table Tennis (46 slots), Pool Table (1 slots); $322.00",
        "lookups",
        "Table Tennis: 46 slots. Pool Table: 2 slots. Cost 322.",
    )
    assert c is not None and c.kind == "facts"
    assert c.missing == ("Pool Table (1 slots)",) and round(c.score, 3) == 0.667


def test_refusals_are_not_scored_and_the_summary_counts_each_kind() -> None:
    assert check_answer(REFUSAL, "adversarial", "anything") is None
    checks = [
        check_answer(NOT_FOUND, "edge", NOT_FOUND),
        check_answer("12", "aggregates", "Exact answer: t.n = 11"),
        check_answer("Ann, Bo", "lookups", "Ann"),
        None,
    ]
    s = summarize_answers(checks)
    assert (s.negatives, s.negatives_right, s.aggregates, s.aggregates_right) == (1, 1, 1, 0)
    assert s.fact_questions == 1 and s.fact_recall == 0.5
