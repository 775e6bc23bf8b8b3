-- 0001: the chunk store.
-- Frozen once released (sql/incremental/frozen.txt). Change the schema in a new file.
--
-- Read from session settings set by the migration runner (pgrag/migrate.py):
--   pgrag.embedding_dim          vector dimension (default 384)
--   pgrag.hnsw_m                 HNSW m (default 16)
--   pgrag.hnsw_ef_construction   HNSW ef_construction (default 64)

-- Remember whether pgrag created the extension, so downgrade drops only what upgrade made.
create temporary table pgrag_migration_vector_existed on commit drop as
select exists (select 1 from pg_catalog.pg_extension where extname = 'vector') as existed;

create extension if not exists vector;

create schema pgrag;

comment on schema pgrag is 'pgrag: relationship-preserving RAG chunks, search and sync functions';

create table pgrag.settings (
    singleton boolean primary key default true check (singleton),
    embedding_dim integer not null check (embedding_dim between 1 and 2000),
    embedding_model text,
    hnsw_m integer not null check (hnsw_m between 2 and 100),
    hnsw_ef_construction integer not null check (hnsw_ef_construction between 4 and 1000),
    created_vector_extension boolean not null,
    created_at timestamptz not null default now()
);

comment on table pgrag.settings is
    'One row: the embedding dimension and model of this store, fixed at migration time';

insert into pgrag.settings (embedding_dim, hnsw_m, hnsw_ef_construction, created_vector_extension)
select coalesce(nullif(current_setting('pgrag.embedding_dim', true), '')::integer, 384),
       coalesce(nullif(current_setting('pgrag.hnsw_m', true), '')::integer, 16),
       coalesce(nullif(current_setting('pgrag.hnsw_ef_construction', true), '')::integer, 64),
       not existed
from pgrag_migration_vector_existed;

-- sha256 of the UTF-8 bytes of a text. convert_to() is only stable (it looks up encodings);
-- for a fixed target encoding it is immutable, which a generated column needs. (A plain
-- text::bytea cast would read backslashes as escapes, and fail on some texts.)
create function pgrag.text_sha256(t text)
returns bytea
language sql immutable strict parallel safe security invoker
set search_path = pg_catalog, pg_temp
return sha256(convert_to(t, 'UTF8'));

create table pgrag.chunks (
    id bigint generated always as identity primary key,
    doc_type text not null check (doc_type <> ''),
    source_key text not null,
    parent_id bigint references pgrag.chunks (id) on delete cascade,
    text text not null,
    metadata jsonb not null default '{}'::jsonb check (jsonb_typeof(metadata) = 'object'),
    content_hash bytea generated always as (pgrag.text_sha256(text)) stored,
    tsv tsvector generated always as (to_tsvector('english'::regconfig, text)) stored,
    embedding_model text,
    embedded_at timestamptz,
    updated_at timestamptz not null default now(),
    unique (doc_type, source_key)
);

comment on table pgrag.chunks is
    'Relationship-preserving documents; embedding NULL means waiting for the worker';

-- The vector column and its HNSW index take their sizes from the settings row.
do $$
declare
    s pgrag.settings;
begin
    select * into strict s from pgrag.settings;
    execute format('alter table pgrag.chunks add column embedding vector(%s)', s.embedding_dim);
    execute format(
        'create index chunks_embedding_hnsw on pgrag.chunks'
        ' using hnsw (embedding vector_cosine_ops) with (m = %s, ef_construction = %s)',
        s.hnsw_m, s.hnsw_ef_construction);
end
$$;

create index chunks_tsv_gin on pgrag.chunks using gin (tsv);
create index chunks_metadata_gin on pgrag.chunks using gin (metadata jsonb_path_ops);
create index chunks_parent_id on pgrag.chunks (parent_id) where parent_id is not null;
-- Chunks waiting for a vector: the worker's queue, cheap to scan however big the store.
create index chunks_pending on pgrag.chunks (id) where embedding is null;
