"""Is the answer right? Each question's answer against its expected answer (SQL ground truth):

- a negative (expected "Cannot find that information in the provided data") is right when the
  answer says exactly that;
- an aggregate (category ``aggregates``) is right when every number of the expected answer is in
  the answer (1,234.50 = 1234.5 = $1,234.50);
- any other question scores its fact recall: the share of the expected answer's facts (its
  comma-, colon- or semicolon-separated items: names, ids, amounts) whose words and numbers are
  all in the answer.

Adversarial questions (expected: a refusal) are not scored here: the faithfulness check and the
LLM judge cover them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from pgrag.lab.eval.questions import NOT_FOUND, REFUSAL

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class AnswerCheck:
    kind: str  # negative, aggregate, facts (None for adversarial: not scored)
    score: float  # 1.0 right, 0.0 wrong; facts: the share of facts found
    missing: tuple[str, ...]  # the facts (or numbers) the answer lacks


@dataclass(frozen=True)
class AnswerSummary:
    """Over a run: negatives answered "cannot find", aggregates exact, mean fact recall."""

    negatives: int
    negatives_right: int
    aggregates: int
    aggregates_right: int
    fact_questions: int
    fact_recall: float | None


def check_answer(expected: str, category: str, answer: str) -> AnswerCheck | None:
    """How ``answer`` does against ``expected``; None for a question not scored here."""
    if expected.strip() == REFUSAL:
        return None
    if expected.strip().rstrip(".") == NOT_FOUND:
        right = answer.strip().startswith(NOT_FOUND)
        return AnswerCheck("negative", 1.0 if right else 0.0, () if right else (NOT_FOUND,))
    if category == "aggregates":
        # the first number of the expected answer is the one asked for (the rest is context:
        # "$70.00 (41 bookings, 60 slots)"); an answer that names the statistic it answers
        # with is held to that line alone
        headline = re.search(r"^Exact answer:.*$", answer, re.M)
        said = headline.group(0) if headline else answer
        wanted = _NUMBER.findall(expected)[:1]
        present = {_number(n) for n in _NUMBER.findall(said)}
        missing = tuple(n for n in wanted if _number(n) not in present)
        return AnswerCheck("aggregate", 0.0 if missing or not wanted else 1.0, missing)
    facts = [f.strip() for f in re.split(r"[;,:]\s+|\n", expected) if f.strip()]
    if not facts:
        return None
    words = set(_words(answer))
    missing = tuple(f for f in facts if not set(_words(f)) <= words)
    return AnswerCheck("facts", (len(facts) - len(missing)) / len(facts), missing)


def _words(text: str) -> list[str]:
    """A text's words and numbers, lower-case, numbers normalised ($1,234.50 -> 1234.5)."""
    out: list[str] = []
    for token in re.findall(r"-?\d[\d,]*(?:\.\d+)?|[^\W\d_]+", text.lower()):
        number = _number(token) if token[0].isdigit() or token[0] == "-" else None
        out.append(str(number) if number is not None else token)
    return out


def _number(text: str) -> Decimal | None:
    try:
        value = Decimal(text.replace(",", ""))
        return value.quantize(Decimal(1)) if value == value.to_integral() else value.normalize()
    except InvalidOperation:
        return None


def summarize_answers(checks: Sequence[AnswerCheck | None]) -> AnswerSummary:
    scored = [c for c in checks if c is not None]
    negatives = [c for c in scored if c.kind == "negative"]
    aggregates = [c for c in scored if c.kind == "aggregate"]
    facts = [c.score for c in scored if c.kind == "facts"]
    return AnswerSummary(
        negatives=len(negatives),
        negatives_right=sum(c.score == 1.0 for c in negatives),
        aggregates=len(aggregates),
        aggregates_right=sum(c.score == 1.0 for c in aggregates),
        fact_questions=len(facts),
        fact_recall=round(math.fsum(facts) / len(facts), 6) if facts else None,
    )


__all__ = ["AnswerCheck", "AnswerSummary", "check_answer", "summarize_answers"]
