-- 0005: evaluation runs: retrieval quality tracked over time.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.
--
-- One row per `pgrag eval` run stored with --store (or pgrag.eval.store_run): which question
-- set (name and sha256 of its JSONL), which strategy and k, the mean metrics, the breakdowns by
-- complexity and category, per-query scores, faithfulness and latency summaries.
create table pgrag.eval_runs (
    id bigint generated always as identity primary key,
    created_at timestamptz not null default now(),
    question_set text not null check (question_set <> ''),
    question_set_sha256 text not null check (question_set_sha256 ~ '^[0-9a-f]{64}$'),
    strategy text not null check (strategy <> ''),
    k integer not null check (k > 0),
    questions integer not null check (questions >= 0),
    embedding_model text,
    pgrag_version text not null,
    metrics jsonb not null check (jsonb_typeof(metrics) = 'object'),
    by_label jsonb not null default '{}' check (jsonb_typeof(by_label) = 'object'),
    per_query jsonb not null default '[]' check (jsonb_typeof(per_query) = 'array'),
    faithfulness jsonb check (faithfulness is null or jsonb_typeof(faithfulness) = 'object'),
    latency_ms jsonb check (latency_ms is null or jsonb_typeof(latency_ms) = 'object'),
    notes text
);

create index eval_runs_set_strategy_idx
    on pgrag.eval_runs (question_set, strategy, created_at desc);

comment on table pgrag.eval_runs is
    'One row per stored evaluation run: question set, strategy, k, metrics (means, by label, per query)';
