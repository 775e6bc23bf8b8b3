"""Run a question set through a retrieval strategy, score it, check its answers, store the run.

``run_eval(conn, questions, strategy)`` asks every question, turns each strategy's hits into a
ranking of the question set's doc ids (the credit rule below), scores it with
``pgrag.lab.eval.metrics.evaluate``, builds an answer from the top hits (extractive, or through the
configured LLM) and checks it with ``pgrag.lab.eval.faithfulness``. ``store_run(conn, result)``
inserts the result into ``pgrag.eval_runs``; ``list_runs`` reads them back.

The strategies, by name: ``pgrag.lab.strategies``.

The credit rule (how a hit maps to the labels): relevant documents are named
``doc_type:source_key`` (``customer_profile:1``, ``order_detail:4012``). A hit *belongs to* its
own doc id, and to each entity whose key is in its metadata, through ``entity_keys``
(``{"order_id": "order_detail", "customer_id": "customer_profile"}`` for the shop): a
``table_row`` order row with ``order_id`` 4012 and ``customer_id`` 1 belongs to
``order_detail:4012`` and ``customer_profile:1``; a ``join_row`` (one order item, flattened) to
its order and its customer; an ``order_detail`` child (returned with its parent) to itself and
its customer's profile. Each hit takes one rank: it is credited to the first relevant document
it belongs to that no earlier hit was credited with; otherwise it stays a non-relevant result at
that rank. So k hits always fill k ranks, every strategy is judged by the same rule, and a
relevant document counts once however many of its rows are found.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgrag import migrate
from pgrag.answer import Context, LLMConfig, answer
from pgrag.errors import ConfigError, mapped_database_errors
from pgrag.lab.eval.answers import AnswerCheck, AnswerSummary, check_answer, summarize_answers
from pgrag.lab.eval.faithfulness import Verdict, check, judge
from pgrag.lab.eval.metrics import METRICS, Means, QueryScores, Report, evaluate
from pgrag.lab.eval.questions import Question, dumps_jsonl, labels, qrels
from pgrag.lab.sample_documents import COMPARISON_TYPES
from pgrag.lab.strategies import Strategy, get_strategy
from pgrag.search import SearchHit

if TYPE_CHECKING:
    from pgrag.embed.base import Embedder
    from pgrag.embed.cache import QueryCache

TOP_N = 5  # hits given to the answer
SHOP_ENTITIES: dict[str, str] = {"order_id": "order_detail", "customer_id": "customer_profile"}
NORTHWIND_ENTITIES: dict[str, str] = {"order_id": "nw_order", "customer_id": "nw_customer"}
CLUBDATA_ENTITIES: dict[str, str] = {
    "month_key": "club_member_month",
    "member_id": "club_member",
    "facility_id": "club_facility",
}
KNOWN_ENTITIES = (SHOP_ENTITIES, NORTHWIND_ENTITIES, CLUBDATA_ENTITIES)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Latency:
    """Retrieval latency in milliseconds (the question's embedding excluded)."""

    p50: float
    p95: float
    mean: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Latency:
        if not values:
            return cls(0.0, 0.0, 0.0, 0.0)
        ordered = sorted(values)
        return cls(
            round(_percentile(ordered, 50), 3),
            round(_percentile(ordered, 95), 3),
            round(math.fsum(ordered) / len(ordered), 3),
            round(ordered[-1], 3),
        )


def _percentile(ordered: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class QuestionRun:
    """One question: what was retrieved, how it was credited, the answer and its checks."""

    id: str
    hits: tuple[str, ...]  # doc_type:source_key of each hit, best first
    ranking: tuple[str, ...]  # the credited ranking the metrics scored
    latency_ms: float
    answer: str
    used_llm: bool
    faithfulness: float | None  # offline check; None when the answer makes no claim
    claims: int
    unsupported: tuple[str, ...]
    verdict: Verdict | None  # the LLM judge's, when an LLM is configured
    filter: Mapping[str, Any] | None  # the filter searched (hybrid)
    answer_check: AnswerCheck | None = None  # the answer against the expected one


@dataclass(frozen=True)
class FaithfulnessSummary:
    """Faithfulness over the answers of a run."""

    answers: int  # answers built
    checked: int  # answers with at least one claim
    mean: float | None  # mean offline score over the checked answers
    claims: int
    unsupported: int
    used_llm: bool
    judged: int = 0
    judge_mean: float | None = None
    judge_fully_supported: float | None = None  # share of judged answers fully supported
    judge_contradicts: float | None = None  # share contradicting the data
    judge_outside_info: float | None = None  # share using outside information


@dataclass(frozen=True)
class EvalResult:
    """A scored run of one question set through one strategy."""

    question_set: str
    question_set_sha256: str
    strategy: str
    k: int
    filters: bool
    report: Report
    questions: tuple[QuestionRun, ...]
    labels: Mapping[str, Mapping[str, str]]
    latency_ms: Latency
    faithfulness: FaithfulnessSummary
    answers: AnswerSummary
    embedding_model: str | None
    pgrag_version: str
    chunks: int  # chunks of the searched document types
    notes: tuple[str, ...] = field(default=())

    @property
    def run(self) -> dict[str, list[str]]:
        """The credited rankings, ``{question id: [doc id, ...]}``, for ``evaluate``."""
        return {q.id: list(q.ranking) for q in self.questions}

    def metrics(self) -> dict[str, Any]:
        return _means(self.report.mean)

    def to_json(self) -> dict[str, Any]:
        """Everything, as JSON types (what ``--json`` writes)."""
        return {
            "question_set": self.question_set,
            "question_set_sha256": self.question_set_sha256,
            "strategy": self.strategy,
            "k": self.k,
            "filters": self.filters,
            "questions": len(self.questions),
            "chunks": self.chunks,
            "embedding_model": self.embedding_model,
            "pgrag_version": self.pgrag_version,
            "metrics": self.metrics(),
            "by_label": by_label_json(self.report),
            "skipped": list(self.report.skipped),
            "latency_ms": _plain(self.latency_ms),
            "faithfulness": _plain(self.faithfulness),
            "answers": _plain(self.answers),
            "per_query": per_query_json(self),
            "notes": list(self.notes),
        }


def _plain(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def _means(m: Means) -> dict[str, Any]:
    return {"count": m.count, **{name: round(getattr(m, name), 6) for name in METRICS}}


def by_label_json(report: Report) -> dict[str, dict[str, dict[str, Any]]]:
    return {
        name: {value: _means(m) for value, m in values.items()}
        for name, values in report.by_label.items()
    }


def per_query_json(result: EvalResult) -> list[dict[str, Any]]:
    scores: dict[str, QueryScores] = {s.query_id: s for s in result.report.per_query}
    out = []
    for q in result.questions:
        s = scores.get(q.id)
        out.append(
            {
                "id": q.id,
                **dict(result.labels.get(q.id, {})),
                "scores": None
                if s is None
                else {name: round(getattr(s, name), 6) for name in METRICS},
                "relevant": None if s is None else s.relevant,
                "hits": list(q.hits[: result.k]),
                "latency_ms": q.latency_ms,
                "faithfulness": q.faithfulness,
                "claims": q.claims,
                "unsupported": list(q.unsupported),
                "judge": None if q.verdict is None else _plain(q.verdict),
                "filter": q.filter,
                "answer_check": None if q.answer_check is None else _plain(q.answer_check),
            }
        )
    return out


# ---------------------------------------------------------------- the credit rule


def entity_keys_for(questions: Sequence[Question]) -> dict[str, str]:
    """The entity map whose document types name every relevant chunk of ``questions``."""
    types = {r.doc_type for q in questions for r in q.relevant}
    for known in KNOWN_ENTITIES:
        if types and types <= set(known.values()):
            return dict(known)
    return {}


def belongs_to(hit: SearchHit, entity_keys: Mapping[str, str]) -> list[str]:
    """The doc ids a hit belongs to: its own, then each entity keyed in its metadata."""
    out = [f"{hit.doc_type}:{hit.source_key}"]
    for key, doc_type in entity_keys.items():
        value = hit.metadata.get(key) if isinstance(hit.metadata, Mapping) else None
        if isinstance(value, bool) or value is None or isinstance(value, list | dict):
            continue
        doc = f"{doc_type}:{value}"
        if doc not in out:
            out.append(doc)
    return out


def credit(belongs: Sequence[Sequence[str]], relevant: set[str]) -> list[str]:
    """One doc id per hit: the first relevant one not yet credited, else the hit's own id."""
    credited: set[str] = set()
    out: list[str] = []
    for rank, docs in enumerate(belongs, start=1):
        pick = next((d for d in docs if d in relevant and d not in credited), None)
        if pick is None:
            own = docs[0] if docs else "?"
            # a unique id: the hit stays at its rank as a non-relevant result
            out.append(own if own not in relevant and own not in out else f"{own}#{rank}")
        else:
            credited.add(pick)
            out.append(pick)
    return out


# ---------------------------------------------------------------- SQL


def named_queries(filename: str) -> dict[str, str]:
    """The ``-- name: X`` statements of ``sql/eval/<filename>``."""
    text = (migrate.sql_dir() / "eval" / filename).read_text(encoding="utf-8")
    parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.MULTILINE)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def _query(name: str) -> sql.SQL:
    # the file is ours, shipped with the package: a trusted literal, not user input
    return sql.SQL(named_queries("eval_runs.sql")[name])  # type: ignore[arg-type,unused-ignore]


def chunk_counts(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int]]:
    """``{doc_type: (chunks, waiting for a vector)}``."""
    with mapped_database_errors():
        rows = conn.execute(_query("chunk_counts")).fetchall()
    return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}


def embedding_model(conn: psycopg.Connection[Any]) -> str | None:
    with mapped_database_errors():
        row = conn.execute(_query("embedding_model")).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def pgrag_version() -> str:
    try:
        return importlib_metadata.version("pgrag-relational")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sha256_of_questions(questions: Sequence[Question]) -> str:
    """The sha256 of the JSONL that ``write_jsonl`` would write for ``questions``."""
    return hashlib.sha256(dumps_jsonl(questions).encode("utf-8")).hexdigest()


# ---------------------------------------------------------------- running


@dataclass(frozen=True)
class _Retrieved:
    hits: tuple[SearchHit, ...]
    latency_ms: float
    answer: str
    used_llm: bool
    contexts: tuple[str, ...]
    stats: Mapping[str, Any] | None
    filter: Mapping[str, Any] | None


def _contexts(hits: Sequence[SearchHit]) -> list[Context]:
    from pgrag.ask import contexts_of as ask_contexts

    return ask_contexts(hits)


def _retrieve(
    conn: psycopg.Connection[Any],
    question: str,
    strategy: Strategy,
    *,
    k: int,
    filters: bool,
    doc_types: Sequence[str] | None,
    llm: LLMConfig | None,
    embedder: QueryCache,
    among: Sequence[str] | None = None,
) -> _Retrieved:
    from pgrag.ask import ask
    from pgrag.search import search

    if strategy.pipeline:
        r = ask(
            conn,
            question,
            k=k,
            top_n=TOP_N,
            filter=None if filters else {},
            doc_types=doc_types,
            llm=llm,
            use_env_llm=False,
            embedder=embedder,
            among=among,
        )
        t = r.timings
        latency = t["total_ms"] - t.get("embed_ms", 0.0) - t.get("generate_ms", 0.0)
        contexts = tuple(c.text for c in _contexts(r.hits))
        return _Retrieved(
            r.retrieved, latency, r.answer.text, r.answer.used_llm, contexts, r.stats, r.filter
        )
    types = list(doc_types) if doc_types else strategy.doc_types
    found = search(
        conn,
        question,
        doc_types=list(types) if types else None,
        k=k,
        mode=strategy.mode,
        embedder=None if strategy.mode == "text" else embedder,
    )
    t = found.timings
    latency = t["total_ms"] - t.get("embed_ms", 0.0)
    ctx = _contexts(found.hits[:TOP_N])
    made = answer(question, ctx, None, llm=llm)
    return _Retrieved(
        found.hits, latency, made.text, made.used_llm, tuple(c.text for c in ctx), None, None
    )


def run_eval(
    conn: psycopg.Connection[Any],
    questions: Sequence[Question],
    strategy: str | Strategy = "hybrid",
    *,
    k: int = 10,
    filters: bool = True,
    doc_types: Sequence[str] | None = None,
    question_set: str = "questions",
    question_set_sha256: str | None = None,
    entity_keys: Mapping[str, str] | None = None,
    llm: LLMConfig | None = None,
    judge_answers: bool = True,
    embedder: str | Embedder | QueryCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Ask every question through ``strategy``, score the rankings and check the answers.

    ``llm`` answers (and, with ``judge_answers``, judges) through a chat endpoint; None gives
    extractive answers and the offline check only. ``entity_keys`` defaults to the map whose
    document types the question set names (``entity_keys_for``). ``progress(done, total)``
    is called after each question.
    """
    from pgrag.embed.cache import QueryCache
    from pgrag.search import query_cache_for

    strat = strategy if isinstance(strategy, Strategy) else get_strategy(strategy)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 1000:
        raise ConfigError(f"k = {k!r} is out of range: use 1 to 1000, e.g. 10")
    if not questions:
        raise ConfigError("the question set is empty: give at least one question")
    counts = chunk_counts(conn)
    types = list(doc_types) if doc_types else strat.doc_types
    missing = [t for t in types or () if t not in counts]
    if missing:
        hint = (
            "run `pgrag sample load --comparisons` (or pgrag bench strategies)"
            if set(missing) & {"table_row", "join_row"}
            else "declare and render it, or pick another strategy"
        )
        raise ConfigError(
            f"strategy {strat.name!r} searches document type {', '.join(missing)}, which has "
            f"no chunks in this database: {hint}"
        )
    searched = [t for t in counts if types is None or t in types]
    if strat.pipeline and types is None:
        # the benchmark's comparison types share the store: the pipeline's parse never picks them
        searched = [t for t in searched if t not in COMPARISON_TYPES] or searched
    chunks = sum(counts[t][0] for t in searched)
    waiting = sum(counts[t][1] for t in searched)
    notes: list[str] = []
    if waiting and strat.mode != "text":
        notes.append(
            f"{waiting:,} of {chunks:,} searched chunks have no vector yet (run `pgrag embed`): "
            "vector search cannot find them"
        )
    keys = dict(entity_keys) if entity_keys is not None else entity_keys_for(questions)
    cache = embedder if isinstance(embedder, QueryCache) else query_cache_for(embedder)
    judged = qrels(questions)
    runs: list[QuestionRun] = []
    for i, q in enumerate(questions, start=1):
        got = _retrieve(
            conn, q.question, strat, k=k, filters=filters, doc_types=doc_types, llm=llm,
            embedder=cache, among=searched,
        )  # fmt: skip
        relevant = {d for d, g in judged[q.id].items() if g >= 1}
        belongs = [belongs_to(h, keys) for h in got.hits]
        faith = check(got.answer, got.contexts, got.stats)
        verdict = None
        if llm is not None and judge_answers:
            verdict = judge(q.question, got.answer, got.contexts, got.stats, llm)
        runs.append(
            QuestionRun(
                id=q.id,
                hits=tuple(f"{h.doc_type}:{h.source_key}" for h in got.hits),
                ranking=tuple(credit(belongs, relevant)),
                latency_ms=round(got.latency_ms, 3),
                answer=got.answer,
                used_llm=got.used_llm,
                faithfulness=faith.score,
                claims=len(faith.claims),
                unsupported=tuple(c.text for c in faith.unsupported),
                verdict=verdict,
                filter=got.filter,
                answer_check=check_answer(q.expected_answer, q.category, got.answer),
            )
        )
        if progress is not None:
            progress(i, len(questions))
    question_labels = labels(questions)
    report = evaluate(judged, {r.id: list(r.ranking) for r in runs}, k, labels=question_labels)
    return EvalResult(
        question_set=question_set,
        question_set_sha256=question_set_sha256 or sha256_of_questions(questions),
        strategy=strat.name,
        k=k,
        filters=filters if strat.pipeline else False,
        report=report,
        questions=tuple(runs),
        labels=question_labels,
        latency_ms=Latency.of([r.latency_ms for r in runs]),
        faithfulness=summarize_faithfulness(runs),
        answers=summarize_answers([r.answer_check for r in runs]),
        embedding_model=embedding_model(conn),
        pgrag_version=pgrag_version(),
        chunks=chunks,
        notes=tuple(notes),
    )


def _mean(values: Sequence[float]) -> float | None:
    return round(math.fsum(values) / len(values), 6) if values else None


def summarize_faithfulness(runs: Sequence[QuestionRun]) -> FaithfulnessSummary:
    scores = [r.faithfulness for r in runs if r.faithfulness is not None]
    verdicts = [r.verdict for r in runs if r.verdict is not None]
    n = len(verdicts)
    return FaithfulnessSummary(
        answers=len(runs),
        checked=len(scores),
        mean=_mean(scores),
        claims=sum(r.claims for r in runs),
        unsupported=sum(len(r.unsupported) for r in runs),
        used_llm=any(r.used_llm for r in runs),
        judged=n,
        judge_mean=_mean([v.score for v in verdicts]),
        judge_fully_supported=_mean([float(v.fully_supported) for v in verdicts]) if n else None,
        judge_contradicts=_mean([float(v.contradicts_context) for v in verdicts]) if n else None,
        judge_outside_info=_mean([float(v.uses_outside_info) for v in verdicts]) if n else None,
    )


# ---------------------------------------------------------------- storing


@dataclass(frozen=True)
class StoredRun:
    """A row of pgrag.eval_runs (per-query scores and breakdowns left out)."""

    id: int
    created_at: Any  # datetime
    question_set: str
    question_set_sha256: str
    strategy: str
    k: int
    questions: int
    embedding_model: str | None
    pgrag_version: str
    metrics: dict[str, Any]
    faithfulness: dict[str, Any] | None
    latency_ms: dict[str, Any] | None
    notes: str | None


def store_run(conn: psycopg.Connection[Any], result: EvalResult) -> int:
    """Insert ``result`` into pgrag.eval_runs (one statement); returns the new row's id."""
    data = result.to_json()
    params = {
        "question_set": result.question_set,
        "question_set_sha256": result.question_set_sha256,
        "strategy": result.strategy,
        "k": result.k,
        "questions": len(result.questions),
        "embedding_model": result.embedding_model,
        "pgrag_version": result.pgrag_version,
        "metrics": Jsonb(
            {**data["metrics"], "filters": result.filters, "skipped": data["skipped"]}
        ),
        "by_label": Jsonb(data["by_label"]),
        "per_query": Jsonb(data["per_query"]),
        "faithfulness": Jsonb(data["faithfulness"]),
        "latency_ms": Jsonb(data["latency_ms"]),
        "notes": "; ".join(result.notes) or None,
    }
    with mapped_database_errors(), conn.transaction():
        row = conn.execute(_query("insert_run"), params).fetchone()
    assert row is not None
    return int(row[0])


def list_runs(
    conn: psycopg.Connection[Any],
    *,
    question_set: str | None = None,
    strategy: str | None = None,
    limit: int = 20,
) -> list[StoredRun]:
    """Stored runs, newest first."""
    if isinstance(limit, bool) or not 1 <= limit <= 100_000:
        raise ConfigError(f"limit = {limit!r} is out of range: use 1 to 100000")
    params = {"question_set": question_set, "strategy": strategy, "lim": limit}
    with mapped_database_errors(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(_query("list_runs"), params).fetchall()
    return [StoredRun(**r) for r in rows]


__all__ = [
    "EvalResult",
    "FaithfulnessSummary",
    "Latency",
    "QuestionRun",
    "StoredRun",
    "belongs_to",
    "credit",
    "entity_keys_for",
    "list_runs",
    "run_eval",
    "sha256_of",
    "store_run",
]
