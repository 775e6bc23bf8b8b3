-- 0003: embeddings: the content cache, the query cache and per-chunk embedding failures.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.
--
-- The caches' vector columns have no fixed dimension: they are keyed by model, so vectors of
-- several models (and dimensions) live side by side and are never compared with each other.

-- Content cache: one vector per (model, sha256 of the text). A text the model has seen once is
-- never sent to it again: identical chunks, rebuilt chunks, a switch back to an earlier model.
create table pgrag.embedding_cache (
    model text not null check (model <> ''),
    content_hash bytea not null,
    embedding vector not null,
    created_at timestamptz not null default now(),
    primary key (model, content_hash)
);

comment on table pgrag.embedding_cache is
    'Content cache: the vector of a text under a model, keyed by (model, sha256 of the text)';

-- Query cache: questions (normalized) embedded once, shared by every process; entries older
-- than the reader's TTL are ignored and purged on the next write.
create table pgrag.query_cache (
    model text not null check (model <> ''),
    query_hash bytea not null,
    query text not null,
    embedding vector not null,
    created_at timestamptz not null default now(),
    primary key (model, query_hash)
);

create index query_cache_created_at on pgrag.query_cache (created_at);

comment on table pgrag.query_cache is
    'Query cache: the vector of a normalized question under a model, kept for a TTL';

-- A chunk the embedder failed on: skipped until retry_at, and for good after the worker's
-- maximum attempts, until its text changes (another content_hash) or the errors are cleared.
create table pgrag.embed_errors (
    chunk_id bigint primary key references pgrag.chunks (id) on delete cascade,
    model text not null,
    content_hash bytea not null,
    attempts integer not null check (attempts >= 1),
    error text not null,
    failed_at timestamptz not null default now(),
    retry_at timestamptz not null
);

comment on table pgrag.embed_errors is
    'Chunks the embedder failed on, with the last error; cleared when a vector is written';
